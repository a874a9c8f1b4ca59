package btree

// testingKnobs are the package's test hooks and planted bugs; the zero
// value is production behaviour. Tests set them on a Tree before use.
type testingKnobs struct {
	// onWrite runs after every node write (tests capture the states a
	// concurrent reader may see between writes).
	onWrite func()
	// linkBeforeNode plants a bug: a split writes the node that now links
	// to the new node before the new node exists, so a reader that moves
	// right finds no node there.
	linkBeforeNode bool
}
