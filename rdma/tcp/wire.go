package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmakv/rdmakv/rdma"
)

// Wire format. After the handshake (see handshake.go) a TCP connection
// carries frames in both directions: requests from the initiator (the node
// that called Connect) to the target's software RNIC, responses back. All
// integers are little-endian.
//
// Frame header, 8 bytes:
//
//	0        1        2                 4                                 8
//	+--------+--------+-----------------+---------------------------------+
//	| ver=1  |  type  |  reserved = 0   |  body length n (u32)            |
//	+--------+--------+-----------------+---------------------------------+
//	| body: n bytes, layout by type                                       |
//
// 8 + n must not exceed the receiver's MaxFrame. Bodies (offsets within the
// body):
//
//	initiator -> target (requests; the k-th request of a Conn is op seq k, from 1)
//	  1 write    0 flags u8 (bit 0 Notify, bit 1 Ack) | 1 zero[3] | 4 region u32 | 8 offset u64 | 16 data (n-16 >= 1 bytes)
//	  2 read     0 region u32 | 4 length u32 (>= 1) | 8 offset u64                        n = 16
//	  3 cas      0 region u32 | 4 zero u32 | 8 offset u64 | 16 compare u64 | 24 swap u64   n = 32
//	  4 faa      0 region u32 | 4 zero u32 | 8 offset u64 | 16 addend u64                  n = 24
//	  5 ping     0 token u64                                                          n = 8
//	target -> initiator (responses, in op order)
//	  6 pong     0 token u64 (echoes the ping)                                        n = 8
//	  7 ack      0 seq u64: every op through seq was applied                          n = 8
//	  8 readrsp  0 seq u64 | 8 data (n-8 >= 1 bytes): op seq (a read) and all before it done
//	  9 atomrsp  0 seq u64 | 8 previous value u64: op seq (cas/faa) and all before done  n = 16
//	 10 error    0 seq u64 | 8 code u8 | 9 zero[7]: ops before seq done, seq failed    n = 16
//
// Acknowledgements are lazy: the target acks (cumulatively, once its input
// runs dry) only writes that ask for it with the Ack flag, and in any case
// after every few hundred ops and on a ping. The initiator asks on
// signaled writes, on every 64th op and while a quarter of its send queue
// is outstanding, so an unsignaled write costs no ack frame and no
// wake-up of the initiator. (Version 1 acked every write.)
//
// A frame of an unknown type or version, with nonzero reserved bytes, a
// wrong body length, or longer than MaxFrame is a protocol violation: the
// receiver closes the connection without applying it.
const (
	wireVersion = 2
	headerLen   = 8
	writeFixed  = 16 // write body bytes before the data
	rspFixed    = 8  // readrsp body bytes before the data
)

// Frame types.
const (
	typeWrite   = 1
	typeRead    = 2
	typeCAS     = 3
	typeFAA     = 4
	typePing    = 5
	typePong    = 6
	typeAck     = 7
	typeReadRsp = 8
	typeAtomRsp = 9
	typeError   = 10
)

// Error codes carried by an error frame.
const (
	codePermission = 1
	codeBounds     = 2
	codeNoRegion   = 3
	codeUnaligned  = 4
	codeInvalid    = 5
)

// errMalformed marks a frame or handshake message that does not decode.
var errMalformed = errors.New("tcp: malformed message")

var le = binary.LittleEndian

// header is a decoded frame header.
type header struct {
	Type uint8
	Len  uint32 // body length
}

// appendHeader encodes a frame header.
func appendHeader(b []byte, h header) []byte {
	b = append(b, wireVersion, h.Type, 0, 0)
	return le.AppendUint32(b, h.Len)
}

// decodeHeader decodes the first headerLen bytes of b. It rejects unknown
// versions and types, nonzero reserved bytes and frames longer than
// maxFrame (header included); a maxFrame too small for a header rejects
// every frame.
func decodeHeader(b []byte, maxFrame int) (header, error) {
	if len(b) < headerLen {
		return header{}, fmt.Errorf("%w: header of %d bytes", errMalformed, len(b))
	}
	if b[0] != wireVersion {
		return header{}, fmt.Errorf("%w: frame version %d, want %d", errMalformed, b[0], wireVersion)
	}
	if b[2] != 0 || b[3] != 0 {
		return header{}, fmt.Errorf("%w: nonzero reserved header bytes", errMalformed)
	}
	h := header{Type: b[1], Len: le.Uint32(b[4:])}
	if h.Type < typeWrite || h.Type > typeError {
		return header{}, fmt.Errorf("%w: unknown frame type %d", errMalformed, h.Type)
	}
	if maxFrame < headerLen || uint64(h.Len)+headerLen > uint64(maxFrame) {
		return header{}, fmt.Errorf("%w: frame of %d bytes exceeds MaxFrame %d", errMalformed, uint64(h.Len)+headerLen, maxFrame)
	}
	return h, nil
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func bodyLen(b []byte, n int, what string) error {
	if len(b) != n {
		return fmt.Errorf("%w: %s body of %d bytes, want %d", errMalformed, what, len(b), n)
	}
	return nil
}

// writeReq is a write request body.
type writeReq struct {
	Notify bool
	Ack    bool // acknowledge this write when the input runs dry
	Region rdma.RegionID
	Offset uint64
	Data   []byte
}

// appendWriteReq encodes a whole write frame.
func appendWriteReq(b []byte, w *writeReq) []byte {
	b = appendHeader(b, header{Type: typeWrite, Len: uint32(writeFixed + len(w.Data))})
	var fl byte
	if w.Notify {
		fl |= 1
	}
	if w.Ack {
		fl |= 2
	}
	b = append(b, fl, 0, 0, 0)
	b = le.AppendUint32(b, uint32(w.Region))
	b = le.AppendUint64(b, w.Offset)
	return append(b, w.Data...)
}

// decodeWriteReq decodes a write body; Data aliases b.
func decodeWriteReq(b []byte) (writeReq, error) {
	if len(b) <= writeFixed {
		return writeReq{}, fmt.Errorf("%w: write body of %d bytes carries no data", errMalformed, len(b))
	}
	if b[0]&^3 != 0 || !zero(b[1:4]) {
		return writeReq{}, fmt.Errorf("%w: write flags %#x", errMalformed, b[0:4])
	}
	return writeReq{
		Notify: b[0]&1 != 0,
		Ack:    b[0]&2 != 0,
		Region: rdma.RegionID(le.Uint32(b[4:])),
		Offset: le.Uint64(b[8:]),
		Data:   b[writeFixed:],
	}, nil
}

// readReq is a read request body.
type readReq struct {
	Region rdma.RegionID
	Len    uint32
	Offset uint64
}

// appendReadReq encodes a whole read frame.
func appendReadReq(b []byte, r *readReq) []byte {
	b = appendHeader(b, header{Type: typeRead, Len: 16})
	b = le.AppendUint32(b, uint32(r.Region))
	b = le.AppendUint32(b, r.Len)
	return le.AppendUint64(b, r.Offset)
}

// decodeReadReq decodes a read body.
func decodeReadReq(b []byte) (readReq, error) {
	if err := bodyLen(b, 16, "read"); err != nil {
		return readReq{}, err
	}
	r := readReq{Region: rdma.RegionID(le.Uint32(b)), Len: le.Uint32(b[4:]), Offset: le.Uint64(b[8:])}
	if r.Len == 0 {
		return readReq{}, fmt.Errorf("%w: read of 0 bytes", errMalformed)
	}
	return r, nil
}

// atomicReq is a cas or faa request body (Compare is unused by faa).
type atomicReq struct {
	Region  rdma.RegionID
	Offset  uint64
	Compare uint64
	Value   uint64
}

// appendCASReq encodes a whole cas frame.
func appendCASReq(b []byte, a *atomicReq) []byte {
	b = appendHeader(b, header{Type: typeCAS, Len: 32})
	b = le.AppendUint32(b, uint32(a.Region))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, a.Offset)
	b = le.AppendUint64(b, a.Compare)
	return le.AppendUint64(b, a.Value)
}

// decodeCASReq decodes a cas body.
func decodeCASReq(b []byte) (atomicReq, error) {
	if err := bodyLen(b, 32, "cas"); err != nil {
		return atomicReq{}, err
	}
	if !zero(b[4:8]) {
		return atomicReq{}, fmt.Errorf("%w: cas reserved bytes", errMalformed)
	}
	return atomicReq{Region: rdma.RegionID(le.Uint32(b)), Offset: le.Uint64(b[8:]), Compare: le.Uint64(b[16:]), Value: le.Uint64(b[24:])}, nil
}

// appendFAAReq encodes a whole faa frame.
func appendFAAReq(b []byte, a *atomicReq) []byte {
	b = appendHeader(b, header{Type: typeFAA, Len: 24})
	b = le.AppendUint32(b, uint32(a.Region))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, a.Offset)
	return le.AppendUint64(b, a.Value)
}

// decodeFAAReq decodes a faa body.
func decodeFAAReq(b []byte) (atomicReq, error) {
	if err := bodyLen(b, 24, "faa"); err != nil {
		return atomicReq{}, err
	}
	if !zero(b[4:8]) {
		return atomicReq{}, fmt.Errorf("%w: faa reserved bytes", errMalformed)
	}
	return atomicReq{Region: rdma.RegionID(le.Uint32(b)), Offset: le.Uint64(b[8:]), Value: le.Uint64(b[16:])}, nil
}

// appendWord encodes a whole frame of type t (ping, pong, ack) whose body
// is one u64.
func appendWord(b []byte, t uint8, v uint64) []byte {
	b = appendHeader(b, header{Type: t, Len: 8})
	return le.AppendUint64(b, v)
}

// decodeWord decodes a ping, pong or ack body.
func decodeWord(b []byte) (uint64, error) {
	if err := bodyLen(b, 8, "word"); err != nil {
		return 0, err
	}
	return le.Uint64(b), nil
}

// appendReadRspHeader encodes the frame header and seq of a read response
// carrying n data bytes; the caller appends the data.
func appendReadRspHeader(b []byte, seq uint64, n int) []byte {
	b = appendHeader(b, header{Type: typeReadRsp, Len: uint32(rspFixed + n)})
	return le.AppendUint64(b, seq)
}

// decodeReadRsp decodes a read response body; data aliases b.
func decodeReadRsp(b []byte) (seq uint64, data []byte, err error) {
	if len(b) <= rspFixed {
		return 0, nil, fmt.Errorf("%w: read response of %d bytes carries no data", errMalformed, len(b))
	}
	return le.Uint64(b), b[rspFixed:], nil
}

// appendAtomRsp encodes a whole atomic response frame.
func appendAtomRsp(b []byte, seq, old uint64) []byte {
	b = appendHeader(b, header{Type: typeAtomRsp, Len: 16})
	b = le.AppendUint64(b, seq)
	return le.AppendUint64(b, old)
}

// decodeAtomRsp decodes an atomic response body.
func decodeAtomRsp(b []byte) (seq, old uint64, err error) {
	if err := bodyLen(b, 16, "atomic response"); err != nil {
		return 0, 0, err
	}
	return le.Uint64(b), le.Uint64(b[8:]), nil
}

// appendErrorRsp encodes a whole error frame.
func appendErrorRsp(b []byte, seq uint64, code uint8) []byte {
	b = appendHeader(b, header{Type: typeError, Len: 16})
	b = le.AppendUint64(b, seq)
	return append(b, code, 0, 0, 0, 0, 0, 0, 0)
}

// decodeErrorRsp decodes an error body.
func decodeErrorRsp(b []byte) (seq uint64, code uint8, err error) {
	if err := bodyLen(b, 16, "error"); err != nil {
		return 0, 0, err
	}
	if b[8] < codePermission || b[8] > codeInvalid || !zero(b[9:16]) {
		return 0, 0, fmt.Errorf("%w: error code %#x", errMalformed, b[8:16])
	}
	return le.Uint64(b), b[8], nil
}

// codeErr maps an error code to its rdma sentinel.
func codeErr(code uint8) error {
	switch code {
	case codePermission:
		return rdma.ErrPermission
	case codeBounds:
		return rdma.ErrBounds
	case codeNoRegion:
		return rdma.ErrNoRegion
	case codeUnaligned:
		return rdma.ErrUnaligned
	}
	return rdma.ErrInvalidOp
}

// errCode maps an rdma sentinel to its error code.
func errCode(err error) uint8 {
	switch err {
	case rdma.ErrPermission:
		return codePermission
	case rdma.ErrBounds:
		return codeBounds
	case rdma.ErrNoRegion:
		return codeNoRegion
	case rdma.ErrUnaligned:
		return codeUnaligned
	}
	return codeInvalid
}

// Handshake messages. Before any frame, the dialer (D) and the acceptor (A)
// exchange four fixed-size messages of one layout, 80 bytes:
//
//	0          4        6      7        8          12         16            48            80
//	+----------+--------+------+--------+----------+----------+-------------+-------------+
//	| "RDKV"   | ver u16| type | status | from u32 | to u32   | nonce [32]  | mac [32]    |
//	+----------+--------+------+--------+----------+----------+-------------+-------------+
//
//	D -> A  hello      from=D to=A nonce=nD
//	A -> D  challenge  from=A to=D nonce=nA mac=HMAC(secret, "rdmakv/tcp acceptor" ver D A nD nA)
//	D -> A  proof      from=D to=A          mac=HMAC(secret, "rdmakv/tcp dialer"   ver D A nD nA)
//	A -> D  welcome    from=A to=D
//
// Either side may instead send a reject with a status (bad version, wrong
// node, authentication failed) and close. Both nonces are fresh random
// bytes, so neither MAC can be replayed, and the secret never crosses the
// wire. Any version is decoded, so that a mismatch can be reported.
const (
	helloLen   = 80
	helloMagic = "RDKV"
)

// Handshake message types.
const (
	hsHello     = 1
	hsChallenge = 2
	hsProof     = 3
	hsWelcome   = 4
	hsReject    = 5
)

// Reject statuses.
const (
	stOK         = 0
	stBadVersion = 1
	stWrongNode  = 2
	stAuth       = 3
	stClosing    = 4
)

// hsMsg is a handshake message.
type hsMsg struct {
	Version uint16
	Type    uint8
	Status  uint8
	From    rdma.NodeID
	To      rdma.NodeID
	Nonce   [32]byte
	MAC     [32]byte
}

// appendHsMsg encodes a handshake message.
func appendHsMsg(b []byte, m *hsMsg) []byte {
	b = append(b, helloMagic...)
	b = le.AppendUint16(b, m.Version)
	b = append(b, m.Type, m.Status)
	b = le.AppendUint32(b, uint32(m.From))
	b = le.AppendUint32(b, uint32(m.To))
	b = append(b, m.Nonce[:]...)
	return append(b, m.MAC[:]...)
}

// decodeHsMsg decodes a handshake message of exactly helloLen bytes.
func decodeHsMsg(b []byte) (hsMsg, error) {
	if len(b) != helloLen {
		return hsMsg{}, fmt.Errorf("%w: handshake message of %d bytes, want %d", errMalformed, len(b), helloLen)
	}
	if string(b[:4]) != helloMagic {
		return hsMsg{}, fmt.Errorf("%w: bad handshake magic %q", errMalformed, b[:4])
	}
	m := hsMsg{Version: le.Uint16(b[4:]), Type: b[6], Status: b[7], From: rdma.NodeID(le.Uint32(b[8:])), To: rdma.NodeID(le.Uint32(b[12:]))}
	if m.Type < hsHello || m.Type > hsReject {
		return hsMsg{}, fmt.Errorf("%w: unknown handshake message type %d", errMalformed, m.Type)
	}
	if m.Status > stClosing {
		return hsMsg{}, fmt.Errorf("%w: unknown handshake status %d", errMalformed, m.Status)
	}
	copy(m.Nonce[:], b[16:48])
	copy(m.MAC[:], b[48:80])
	return m, nil
}
