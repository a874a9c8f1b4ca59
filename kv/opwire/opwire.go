// Package opwire is the op layout that kv's requests (kv/ops.go) and
// btree's ordered requests (btree/request.go) share: a request header
//
//	[format u8][flags u8][count u16]
//
// then count ops, each a header and three parts, each part padded to 8:
//
//	[kind u8][cmp u8][space u8][0 u8][klen u32][vlen u32][clen u32][cver u64]
//	[key][value][cmp value]
//
// It writes and walks that layout (lengths, padding, trailing bytes);
// what formats, kinds, conditions and spaces a request may hold, and what
// they mean, is each package's.
package opwire

import (
	"encoding/binary"
	"fmt"
)

const (
	// ReqHdr is the size of a request's header.
	ReqHdr = 4
	// OpHdr is the size of an op's header.
	OpHdr = 24
)

// Pad8 is n rounded up to a multiple of 8.
func Pad8(n int) int { return (n + 7) &^ 7 }

// Size is the encoded size of an op with these parts.
func Size(key, value, cmpValue []byte) int {
	return OpHdr + Pad8(len(key)) + Pad8(len(value)) + Pad8(len(cmpValue))
}

// AppendRequestHeader appends a request's header, of n ops, to dst.
func AppendRequestHeader(dst []byte, format, flags byte, n int) []byte {
	return append(dst, format, flags, byte(n), byte(n>>8))
}

// AppendOp appends one op to dst.
func AppendOp(dst []byte, kind, cmp, space byte, cmpVersion uint64, key, value, cmpValue []byte) []byte {
	var h [OpHdr]byte
	h[0], h[1], h[2] = kind, cmp, space
	binary.LittleEndian.PutUint32(h[4:], uint32(len(key)))
	binary.LittleEndian.PutUint32(h[8:], uint32(len(value)))
	binary.LittleEndian.PutUint32(h[12:], uint32(len(cmpValue)))
	binary.LittleEndian.PutUint64(h[16:], cmpVersion)
	dst = append(dst, h[:]...)
	for _, b := range [3][]byte{key, value, cmpValue} {
		dst = append(dst, b...)
		dst = append(dst, make([]byte, Pad8(len(b))-len(b))...)
	}
	return dst
}

// Header is an op's header.
type Header struct {
	Kind, Cmp, Space uint8
	Pad              uint8 // the fourth byte: 0 in every valid op
	CmpVersion       uint64
	lens             [3]uint32
}

// Decoder walks the ops of a request: Header, then Parts, for each of
// the count ops; then End. Its errors wrap the error it was made with.
type Decoder struct {
	b         []byte
	p         int
	malformed error
}

// NewDecoder checks b's request header (format and flags; malformed
// itself if they differ or b is shorter) and returns a decoder at the
// first op and the count of ops (an error if 0).
func NewDecoder(b []byte, format, flags byte, malformed error) (Decoder, int, error) {
	d := Decoder{b: b, p: ReqHdr, malformed: malformed}
	if len(b) < ReqHdr || b[0] != format || b[1] != flags {
		return d, 0, malformed
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if n == 0 {
		return d, 0, fmt.Errorf("%w: no operations", malformed)
	}
	return d, n, nil
}

// Header reads the next op's header.
func (d *Decoder) Header() (Header, error) {
	if len(d.b)-d.p < OpHdr {
		return Header{}, fmt.Errorf("%w: truncated", d.malformed)
	}
	h := d.b[d.p : d.p+OpHdr]
	d.p += OpHdr
	return Header{Kind: h[0], Cmp: h[1], Space: h[2], Pad: h[3], CmpVersion: binary.LittleEndian.Uint64(h[16:]),
		lens: [3]uint32{binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[8:]), binary.LittleEndian.Uint32(h[12:])}}, nil
}

// Parts reads the parts of the op whose header h is: slices of the
// request (capacity cut at their length), their padding zero.
func (d *Decoder) Parts(h Header) (key, value, cmpValue []byte, err error) {
	var parts [3][]byte
	for k := range parts {
		l := int(h.lens[k])
		if l < 0 || l > len(d.b)-d.p || Pad8(l) > len(d.b)-d.p {
			return nil, nil, nil, fmt.Errorf("%w: truncated", d.malformed)
		}
		parts[k] = d.b[d.p : d.p+l : d.p+l]
		for _, x := range d.b[d.p+l : d.p+Pad8(l)] {
			if x != 0 {
				return nil, nil, nil, fmt.Errorf("%w: padding not zero", d.malformed)
			}
		}
		d.p += Pad8(l)
	}
	return parts[0], parts[1], parts[2], nil
}

// End checks that no byte follows the last op.
func (d *Decoder) End() error {
	if d.p != len(d.b) {
		return fmt.Errorf("%w: %d trailing bytes", d.malformed, len(d.b)-d.p)
	}
	return nil
}
