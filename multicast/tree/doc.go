// Package tree is the static overlay tree of groups that TRAM atomic
// multicast orders messages along (TRAM, sections 4 and 8, Fig. 4). Every
// group talks only to its parent and its children; clients and replicas
// know the same Tree in advance and it never changes during a run.
//
// # Reach and lca
//
// The reach of a group g is g itself and every group below it: the groups a
// message can get to from g by travelling down the tree (Tree.Reach). The
// lca of a non-empty destination set dst is the lowest group whose reach
// contains all of dst (Tree.LCA): the group farthest from the root from
// which every destination can be reached travelling down. (The paper words
// it as "the closest group to the root from which all destinations can be
// reached", meaning the first such group on the way up from the
// destinations; the root always qualifies, so the lowest one is meant.) The
// lca is a destination's ancestor or the destination itself, so it is found
// by walking up from any destination until the reach covers dst.
//
// A client writes a message for dst to the lca of dst, which orders it, and
// each group that orders it forwards it to those of its children whose
// reach meets dst (Tree.Next), down to every destination. Two messages
// with a common destination d both pass through every group on the path
// from the lower of their two lcas down to d; the first of these orders
// them and the others keep that order, which is why their order agrees at
// all their common destinations.
//
// # Shapes
//
// Shape builds the three overlays of the paper's evaluation (Fig. 4),
// drawn here for 8 groups. "base" is a balanced binary tree in heap order,
// the children of g being 2g+1 and 2g+2:
//
//	        0
//	     /     \
//	    1       2
//	   / \     / \
//	  3   4   5   6
//	 /
//	7
//
// "breadth" hangs every other group directly off the root, so an lca is
// either the root or the single destination and a message takes at most
// one hop down:
//
//	            0
//	 /   /   /  |  \   \   \
//	1   2   3   4   5   6   7
//
// "depth" is the chain 0->1->...->7, in which a message travels from its
// lowest-numbered destination down to its highest:
//
//	0 - 1 - 2 - 3 - 4 - 5 - 6 - 7
//
// # Text form
//
// Parse reads a tree as its parent:children entries separated by ';',
// children separated by ',', whitespace ignored around ids and separators:
//
//	0:1,2;1:3,4;2:5,6;3:7
//
// is the base tree of 8 groups. Groups are 0..n-1 where n-1 is the highest
// id written; each must appear, and every group but the root appears
// exactly once as a child. A group with no children may be written with an
// empty list ("3:"), which is how a one-group tree is written ("0:"). A
// parent has one entry only. Children are kept in ascending order whatever
// order they are written in. Parse also accepts a shape name, with an
// optional group count after a '/': "base", "breadth/4", "depth / 16"; the
// count defaults to 8. Tree.String writes the text form, with entries in
// ascending parent order and leaves left out, and Parse reads it back to an
// equal Tree.
//
// # Limits
//
// Groups are numbered 0..MaxGroups-1 so that a set of groups fits a Set,
// one uint64 bitmask. A Tree is immutable once built and safe for
// concurrent use; Root, Parent, ChildSet, Depth, Reach, Contains, LCA and
// Next take O(1) or O(depth) time and do not allocate.
package tree
