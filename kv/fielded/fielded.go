// Package fielded is the "fielded value" format of rdmakv (docs/kv.md,
// "Fielded values"): one value holding named fields, as a YCSB record
// does, which a replica can update field by field (kv.OpMerge, the
// client's UpdateFields) without the client reading the value first.
//
//	value = uvarint(count) field*count
//	field = uvarint(len(name)) name uvarint(len(value)) value
//
// Fields appear in strictly increasing name order (byte-wise), and every
// uvarint is in its shortest form, so a set of fields has exactly one
// encoding: Decode accepts only bytes that Encode would produce for the
// fields they decode to. A value of 10 fields of 100 bytes named field0
// to field9 takes 1,081 bytes (1,000 of data).
package fielded

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// ErrMalformed is wrapped by every error of Decode, Valid and Merge.
var ErrMalformed = errors.New("kv/fielded: malformed fielded value")

// Encode encodes fields as one fielded value.
func Encode(fields map[string][]byte) []byte {
	return Append(make([]byte, 0, Size(fields)), fields)
}

// Size is the length of fields' encoding.
func Size(fields map[string][]byte) int {
	n := uvarintLen(uint64(len(fields)))
	for name, v := range fields {
		n += uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(v))) + len(v)
	}
	return n
}

// Append appends the encoding of fields to dst.
func Append(dst []byte, fields map[string][]byte) []byte {
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

// Decode decodes a record. The values alias b (each is a full slice
// expression: appending to one never overwrites the next). Malformed
// bytes give an error wrapping ErrMalformed, never a panic.
func Decode(b []byte) (map[string][]byte, error) {
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
		if i > 0 && string(name) <= prev { // (compared without a copy of name)
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

// Selector decodes many records in a row (a scan's) as DecodeSelected
// does, without its per-field allocations: the map keys are the
// selector's own strings (the names it was given, or with none the names
// of the last record it decoded, which the next record's fields reuse
// when they have the same names, as the records of one table do), and the
// named fields are matched by one merge of two sorted lists instead of a
// search of the names per field. Its maps equal DecodeSelected's. Not
// safe for concurrent use.
type Selector struct {
	want  []string // sorted, without duplicates; empty: every field
	names []string // every field: the last record's names, reused as keys
}

// NewSelector returns a Selector keeping the named fields (all of them if
// names is empty). names is not kept.
func NewSelector(names []string) *Selector {
	want := slices.Clone(names)
	slices.Sort(want)
	return &Selector{want: slices.Compact(want)}
}

// Decode is DecodeSelected(b, names) for the selector's names: the whole
// record is checked, and the values alias b.
func (s *Selector) Decode(b []byte) (map[string][]byte, error) {
	count, off, err := readUvarint(b, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: field count: %v", ErrMalformed, err)
	}
	if count > uint64(len(b)-off)/2 {
		return nil, fmt.Errorf("%w: %d fields in %d bytes", ErrMalformed, count, len(b)-off)
	}
	size := int(count)
	if len(s.want) > 0 {
		size = min(size, len(s.want))
	}
	out := make(map[string][]byte, size)
	var prev []byte
	j := 0 // s.want[:j] sort before every name read so far
	for i := range int(count) {
		var name, value []byte
		if name, off, err = readBytes(b, off); err != nil {
			return nil, fmt.Errorf("%w: field %d's name: %v", ErrMalformed, i, err)
		}
		if value, off, err = readBytes(b, off); err != nil {
			return nil, fmt.Errorf("%w: field %d (%.40q)'s value: %v", ErrMalformed, i, name, err)
		}
		if i > 0 && string(name) <= string(prev) {
			return nil, fmt.Errorf("%w: field %d (%.40q) does not sort after field %d (%.40q)", ErrMalformed, i, name, i-1, prev)
		}
		prev = name
		if len(s.want) == 0 {
			if i < len(s.names) && s.names[i] == string(name) {
				out[s.names[i]] = value
				continue
			}
			key := string(name)
			if i < len(s.names) {
				s.names[i] = key
			} else {
				s.names = append(s.names, key)
			}
			out[key] = value
			continue
		}
		for j < len(s.want) && s.want[j] < string(name) {
			j++
		}
		if j < len(s.want) && s.want[j] == string(name) {
			out[s.want[j]] = value
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

// Valid checks that b is a fielded value (nil, or an error wrapping
// ErrMalformed); it allocates nothing.
func Valid(b []byte) error {
	_, err := scan(b)
	return err
}

// scan checks b and returns its field count.
func scan(b []byte) (int, error) {
	count, off, err := readUvarint(b, 0)
	if err != nil {
		return 0, fmt.Errorf("%w: field count: %v", ErrMalformed, err)
	}
	if count > uint64(len(b)-off)/2 {
		return 0, fmt.Errorf("%w: %d fields in %d bytes", ErrMalformed, count, len(b)-off)
	}
	var prev []byte
	for i := range int(count) {
		var name []byte
		if name, off, err = readBytes(b, off); err != nil {
			return 0, fmt.Errorf("%w: field %d's name: %v", ErrMalformed, i, err)
		}
		if _, off, err = readBytes(b, off); err != nil {
			return 0, fmt.Errorf("%w: field %d (%.40q)'s value: %v", ErrMalformed, i, name, err)
		}
		if i > 0 && string(name) <= string(prev) {
			return 0, fmt.Errorf("%w: field %d (%.40q) does not sort after field %d (%.40q)", ErrMalformed, i, name, i-1, prev)
		}
		prev = name
	}
	if off != len(b) {
		return 0, fmt.Errorf("%w: %d bytes after the last field", ErrMalformed, len(b)-off)
	}
	return int(count), nil
}

// fieldIter walks the fields of a valid fielded value.
type fieldIter struct {
	b    []byte
	off  int
	left int
}

func newIter(b []byte, count int) fieldIter {
	_, n := binary.Uvarint(b)
	return fieldIter{b: b, off: n, left: count}
}

// next returns the next field; ok is false at the end.
func (it *fieldIter) next() (name, value []byte, ok bool) {
	if it.left == 0 {
		return nil, nil, false
	}
	it.left--
	name, it.off, _ = readBytes(it.b, it.off)
	value, it.off, _ = readBytes(it.b, it.off)
	return name, value, true
}

// Merge appends to dst the fielded value cur with the fields of upd set:
// a field of upd replaces cur's field of that name or is added; cur's
// other fields stay. The result is canonical (fields in name order).
// Both must be fielded values (an error wrapping ErrMalformed names the
// one that is not; dst is returned unchanged); an empty cur is not one
// (a value of no fields is the byte 0). Merge is a pure function of its
// inputs: every replica computes the same bytes. (kv.OpMerge on an absent
// key stores upd itself.)
func Merge(dst, cur, upd []byte) ([]byte, error) {
	nu, err := scan(upd)
	if err != nil {
		return dst, fmt.Errorf("the update: %w", err)
	}
	nc, err := scan(cur)
	if err != nil {
		return dst, fmt.Errorf("the current value: %w", err)
	}
	// Count the merged fields, then write them.
	count := 0
	walk(cur, nc, upd, nu, func(name, value []byte) { count++ })
	dst = binary.AppendUvarint(dst, uint64(count))
	walk(cur, nc, upd, nu, func(name, value []byte) {
		dst = binary.AppendUvarint(dst, uint64(len(name)))
		dst = append(dst, name...)
		dst = binary.AppendUvarint(dst, uint64(len(value)))
		dst = append(dst, value...)
	})
	return dst, nil
}

// walk calls f with the merged fields of cur and upd in name order.
func walk(cur []byte, nc int, upd []byte, nu int, f func(name, value []byte)) {
	a, b := newIter(cur, nc), newIter(upd, nu)
	an, av, aok := a.next()
	bn, bv, bok := b.next()
	for aok || bok {
		// (bytes.Compare: strings.Compare(string(an), string(bn)) copied
		// both names to the heap, 2 allocations a step on every replica)
		switch c := bytes.Compare(an, bn); {
		case !bok || aok && c < 0:
			f(an, av)
			an, av, aok = a.next()
		case !aok || c > 0:
			f(bn, bv)
			bn, bv, bok = b.next()
		default: // the same name: upd's value
			f(bn, bv)
			an, av, aok = a.next()
			bn, bv, bok = b.next()
		}
	}
}
