package tcp

import (
	"bytes"
	"testing"
)

// Every decoder of untrusted bytes has a fuzz target. Each checks that the
// decoder never panics and that re-encoding what it accepted gives back the
// exact input: there is one encoding per message, so nothing a peer sends
// can mean two things.

func FuzzHeader(f *testing.F) {
	f.Add(appendHeader(nil, header{Type: typeWrite, Len: 24}), 1<<20)
	f.Add(appendHeader(nil, header{Type: typeError, Len: 16}), minMaxFrame)
	f.Add([]byte{2, 1, 0, 0, 8, 0, 0, 0}, 1<<20)
	f.Add([]byte{1, 11, 0, 0, 8, 0, 0, 0}, 1<<20)
	f.Add([]byte{1, 1, 0, 1, 8, 0, 0, 0}, 1<<20)
	f.Add([]byte{1, 1, 0, 0, 255, 255, 255, 255}, 1<<20)
	f.Add([]byte{1, 1}, 1<<20)
	f.Fuzz(func(t *testing.T, b []byte, maxFrame int) {
		h, err := decodeHeader(b, maxFrame)
		if err != nil {
			return
		}
		if int64(h.Len)+headerLen > int64(maxFrame) {
			t.Fatalf("accepted a %d-byte frame with MaxFrame %d", int64(h.Len)+headerLen, maxFrame)
		}
		if got := appendHeader(nil, h); !bytes.Equal(got, b[:headerLen]) {
			t.Fatalf("header %x re-encodes as %x", b[:headerLen], got)
		}
	})
}

// fuzzBody runs a body decoder against b and, when it accepts, checks that
// encode(decode(b)) is header(type, len(b)) followed by b.
func fuzzBody(t *testing.T, typ uint8, b []byte, decodeEncode func([]byte) ([]byte, error)) {
	frame, err := decodeEncode(b)
	if err != nil {
		return
	}
	want := append(appendHeader(nil, header{Type: typ, Len: uint32(len(b))}), b...)
	if !bytes.Equal(frame, want) {
		t.Fatalf("type %d body %x re-encodes as frame %x", typ, b, frame)
	}
}

func bodyOf(frame []byte) []byte { return frame[headerLen:] }

func FuzzWriteReq(f *testing.F) {
	f.Add(bodyOf(appendWriteReq(nil, &writeReq{Notify: true, Region: 3, Offset: 16, Data: []byte("12345678")})))
	f.Add(bodyOf(appendWriteReq(nil, &writeReq{Region: 1, Offset: 1 << 60, Data: []byte{9}})))
	f.Add(bodyOf(appendWriteReq(nil, &writeReq{Notify: true, Ack: true, Region: 2, Data: []byte("acked")})))
	f.Add(make([]byte, 16))
	f.Add([]byte{2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeWrite, b, func(b []byte) ([]byte, error) {
			w, err := decodeWriteReq(b)
			if err != nil {
				return nil, err
			}
			if len(w.Data) == 0 {
				t.Fatal("accepted a write without data")
			}
			return appendWriteReq(nil, &w), nil
		})
	})
}

func FuzzReadReq(f *testing.F) {
	f.Add(bodyOf(appendReadReq(nil, &readReq{Region: 2, Len: 8, Offset: 64})))
	f.Add(bodyOf(appendReadReq(nil, &readReq{Region: 2, Len: 0, Offset: 64})))
	f.Add(make([]byte, 15))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeRead, b, func(b []byte) ([]byte, error) {
			r, err := decodeReadReq(b)
			if err != nil {
				return nil, err
			}
			if r.Len == 0 {
				t.Fatal("accepted an empty read")
			}
			return appendReadReq(nil, &r), nil
		})
	})
}

func FuzzCASReq(f *testing.F) {
	f.Add(bodyOf(appendCASReq(nil, &atomicReq{Region: 1, Offset: 8, Compare: 1, Value: 2})))
	f.Add(append(bodyOf(appendCASReq(nil, &atomicReq{})), 0))
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeCAS, b, func(b []byte) ([]byte, error) {
			a, err := decodeCASReq(b)
			if err != nil {
				return nil, err
			}
			return appendCASReq(nil, &a), nil
		})
	})
}

func FuzzFAAReq(f *testing.F) {
	f.Add(bodyOf(appendFAAReq(nil, &atomicReq{Region: 1, Offset: 8, Value: 5})))
	f.Add(make([]byte, 23))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeFAA, b, func(b []byte) ([]byte, error) {
			a, err := decodeFAAReq(b)
			if err != nil {
				return nil, err
			}
			if a.Compare != 0 {
				t.Fatal("faa decoded a compare value")
			}
			return appendFAAReq(nil, &a), nil
		})
	})
}

// FuzzWord covers ping, pong and ack bodies, which share one layout.
func FuzzWord(f *testing.F) {
	f.Add(bodyOf(appendWord(nil, typePing, 7)))
	f.Add(bodyOf(appendWord(nil, typeAck, 1<<40)))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range []uint8{typePing, typePong, typeAck} {
			fuzzBody(t, typ, b, func(b []byte) ([]byte, error) {
				v, err := decodeWord(b)
				if err != nil {
					return nil, err
				}
				return appendWord(nil, typ, v), nil
			})
		}
	})
}

func FuzzReadRsp(f *testing.F) {
	f.Add(append(bodyOf(appendReadRspHeader(nil, 9, 3)), 1, 2, 3))
	f.Add(make([]byte, 8))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeReadRsp, b, func(b []byte) ([]byte, error) {
			seq, data, err := decodeReadRsp(b)
			if err != nil {
				return nil, err
			}
			if len(data) == 0 {
				t.Fatal("accepted a read response without data")
			}
			return append(appendReadRspHeader(nil, seq, len(data)), data...), nil
		})
	})
}

func FuzzAtomRsp(f *testing.F) {
	f.Add(bodyOf(appendAtomRsp(nil, 3, 42)))
	f.Add(make([]byte, 17))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeAtomRsp, b, func(b []byte) ([]byte, error) {
			seq, old, err := decodeAtomRsp(b)
			if err != nil {
				return nil, err
			}
			return appendAtomRsp(nil, seq, old), nil
		})
	})
}

func FuzzErrorRsp(f *testing.F) {
	f.Add(bodyOf(appendErrorRsp(nil, 5, codeBounds)))
	f.Add(bodyOf(appendErrorRsp(nil, 5, 99)))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBody(t, typeError, b, func(b []byte) ([]byte, error) {
			seq, code, err := decodeErrorRsp(b)
			if err != nil {
				return nil, err
			}
			if errCode(codeErr(code)) != code {
				t.Fatalf("error code %d does not map back to itself", code)
			}
			return appendErrorRsp(nil, seq, code), nil
		})
	})
}

func FuzzHsMsg(f *testing.F) {
	m := hsMsg{Version: wireVersion, Type: hsChallenge, From: 2, To: 1}
	m.Nonce[0], m.MAC[31] = 1, 2
	f.Add(appendHsMsg(nil, &m))
	f.Add(appendHsMsg(nil, &hsMsg{Version: 7, Type: hsReject, Status: stAuth}))
	f.Add(appendHsMsg(nil, &hsMsg{Version: wireVersion, Type: 9}))
	f.Add(append([]byte("RDKX"), make([]byte, helloLen-4)...))
	f.Add(appendWriteReq(nil, &writeReq{Region: 1, Data: make([]byte, 64)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeHsMsg(b)
		if err != nil {
			return
		}
		if got := appendHsMsg(nil, &m); !bytes.Equal(got, b) {
			t.Fatalf("handshake message %x re-encodes as %x", b, got)
		}
	})
}
