// Package btree is rdmakv's ordered keyspace: B-link trees (Lehman and
// Yao) whose nodes live in a group's registered memory, changed only by
// the replicas' apply and read by clients one-sided, as DynaTree
// (Eslahi-Kelorazi, dissertation ch. 3) describes but without its oracle.
// docs/dev/btree-plan.md is the plan this package follows, stage by stage.
//
// This first stage is the tree in one process:
//
//   - layout.go declares the node image every reader decodes: fences, a
//     right and a left link, level, a stamp of the last apply that wrote it,
//     entries, and a check word; Decode validates an image against the id
//     a pointer named (slot and incarnation).
//
//   - Tree is the writer (a replica's apply): Put, Delete, splits that push
//     a separator into the parent in the same change, and merges of
//     emptied leaves into their left sibling. It writes whole node images
//     in an order that keeps every intermediate state correct for a
//     validating reader (new nodes before the links to them).
//
//   - Lookup is the reader: DynaTree's search (Alg. 3 lines 12-19) with its
//     fence check on every node (Alg. 2 line 5), plus the B-link move right
//     through the sibling link when a split moved the key's range, so a
//     reader never waits for a parent to learn of a split.
//
//   - Cache is a client's cache of inner nodes, indexed by fence range per
//     level and bounded by bytes, whose stale entries are dropped one level
//     at a time (Alg. 2 lines 9-12): a warm lookup is one leaf read.
//
//   - Cache.Scan reads the leaves of a range in the order the cached
//     level-1 node lists them and through right links, accepting a leaf
//     only when its stamp is at most the applied index the scan began
//     from and its low fence is the previous leaf's high fence: the pairs
//     are the tree's state at that index, or the scan reports ErrChanged.
//
//   - Check verifies the whole structure; Stats reports its shape.
//
//   - Regions puts the arena and a header (root, geometry, applied index,
//     check word) in a group's registered regions (ids from
//     regions.BTree); Remote reads them one-sided over an rdma.Conn.
//
// Later stages apply ordered ops from the log in every replica, spread
// tablets over groups, and give users keyspaces, kvcli and YCSB E.
package btree
