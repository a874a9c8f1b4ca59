package ycsb

import "github.com/rdmakv/rdmakv/kv/fielded"

// The record encoding is rdmakv's fielded value (package kv/fielded,
// docs/kv.md "Fielded values"): a record's fields in name order, so that a
// replica can merge an update into it (Update is one kv.OpMerge). These
// names are kept for the binding's users.

// ErrMalformed is wrapped by every error of DecodeFields.
var ErrMalformed = fielded.ErrMalformed

// EncodeFields encodes fields as one value (fielded.Encode).
func EncodeFields(fields map[string][]byte) []byte { return fielded.Encode(fields) }

// EncodedSize is the length of fields' encoding.
func EncodedSize(fields map[string][]byte) int { return fielded.Size(fields) }

// AppendFields appends the encoding of fields to dst.
func AppendFields(dst []byte, fields map[string][]byte) []byte { return fielded.Append(dst, fields) }

// DecodeFields decodes a record (fielded.Decode).
func DecodeFields(b []byte) (map[string][]byte, error) { return fielded.Decode(b) }

// DecodeSelected decodes a record but keeps only the named fields (all of
// them if names is empty); the whole record is still checked.
func DecodeSelected(b []byte, names []string) (map[string][]byte, error) {
	return fielded.DecodeSelected(b, names)
}
