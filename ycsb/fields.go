package ycsb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// The record encoding: one value per YCSB record holds all its fields.
//
//	record = uvarint(count) field*count
//	field  = uvarint(len(name)) name uvarint(len(value)) value
//
// Fields appear in strictly increasing name order (byte-wise), and every
// uvarint is in its shortest form, so a record has exactly one encoding:
// DecodeFields accepts only bytes that EncodeFields would produce for the
// fields they decode to. A record of 10 fields of 100 bytes named field0
// to field9 takes 1,081 bytes (1,000 of data).

// ErrMalformed is wrapped by every error of DecodeFields.
var ErrMalformed = errors.New("rdmakv ycsb: malformed record")

// EncodeFields encodes fields as one value.
func EncodeFields(fields map[string][]byte) []byte {
	return AppendFields(make([]byte, 0, EncodedSize(fields)), fields)
}

// EncodedSize is the length of fields' encoding.
func EncodedSize(fields map[string][]byte) int {
	n := uvarintLen(uint64(len(fields)))
	for name, v := range fields {
		n += uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(v))) + len(v)
	}
	return n
}

// AppendFields appends the encoding of fields to dst.
func AppendFields(dst []byte, fields map[string][]byte) []byte {
	var small [16]string
	names := small[:0]
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		v := fields[name]
		dst = binary.AppendUvarint(dst, uint64(len(name)))
		dst = append(dst, name...)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// DecodeFields decodes a record. The values alias b (each is a full slice
// expression: appending to one never overwrites the next). Malformed
// bytes give an error wrapping ErrMalformed, never a panic.
func DecodeFields(b []byte) (map[string][]byte, error) {
	return decodeFields(b, nil)
}

// DecodeSelected decodes a record but keeps only the named fields (all of
// them if names is empty); the whole record is still checked. A name not
// in the record is left out of the map.
func DecodeSelected(b []byte, names []string) (map[string][]byte, error) {
	return decodeFields(b, names)
}

func decodeFields(b []byte, want []string) (map[string][]byte, error) {
	count, off, err := readUvarint(b, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: field count: %v", ErrMalformed, err)
	}
	// Every field takes at least two bytes (two zero lengths).
	if count > uint64(len(b)-off)/2 {
		return nil, fmt.Errorf("%w: %d fields in %d bytes", ErrMalformed, count, len(b)-off)
	}
	size := int(count)
	if len(want) > 0 {
		size = min(size, len(want))
	}
	out := make(map[string][]byte, size)
	var prev string
	for i := range int(count) {
		var name, value []byte
		if name, off, err = readBytes(b, off); err != nil {
			return nil, fmt.Errorf("%w: field %d's name: %v", ErrMalformed, i, err)
		}
		if value, off, err = readBytes(b, off); err != nil {
			return nil, fmt.Errorf("%w: field %d (%.40q)'s value: %v", ErrMalformed, i, name, err)
		}
		if i > 0 && strings.Compare(string(name), prev) <= 0 {
			return nil, fmt.Errorf("%w: field %d (%.40q) does not sort after field %d (%.40q)", ErrMalformed, i, name, i-1, prev)
		}
		prev = string(name)
		if len(want) == 0 || slices.Contains(want, prev) {
			out[prev] = value
		}
	}
	if off != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the last field", ErrMalformed, len(b)-off)
	}
	return out, nil
}

// readUvarint reads a shortest-form uvarint at b[off:].
func readUvarint(b []byte, off int) (uint64, int, error) {
	v, n := binary.Uvarint(b[off:])
	switch {
	case n == 0:
		return 0, off, errors.New("truncated length")
	case n < 0:
		return 0, off, errors.New("length overflows 64 bits")
	case n != uvarintLen(v):
		return 0, off, errors.New("length not in its shortest form")
	}
	return v, off + n, nil
}

// readBytes reads a length-prefixed byte string at b[off:].
func readBytes(b []byte, off int) ([]byte, int, error) {
	n, off, err := readUvarint(b, off)
	if err != nil {
		return nil, off, err
	}
	if n > uint64(len(b)-off) {
		return nil, off, fmt.Errorf("%d bytes announced, %d left", n, len(b)-off)
	}
	end := off + int(n)
	return b[off:end:end], end, nil
}

// uvarintLen is the length of v's shortest uvarint.
func uvarintLen(v uint64) int {
	return max(1, (bits.Len64(v)+6)/7)
}
