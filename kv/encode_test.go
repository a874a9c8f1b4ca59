package kv

import (
	"bytes"
	"testing"
)

// inPlaceRecord is the record as fillRecord writes it straight into
// size bytes of memory that held other bytes (0xa5): what encodeRecord
// must write, whether it built the record on the stack or in place.
func inPlaceRecord(size int, version uint64, key, value []byte) []byte {
	b := bytes.Repeat([]byte{0xa5}, size)
	fillRecord(b, version, key, value)
	return b
}

// TestEncodeRecordStaged: a record built on the stack and copied
// (stageRecord bytes or fewer) is the record written in place, byte for
// byte, also in the alignment padding after it, on both sides of the
// stack buffer's bound; a longer one is written in place.
func TestEncodeRecordStaged(t *testing.T) {
	staged := 0
	for _, klen := range []int{0, 1, 16, 100} {
		for vlen := 0; vlen <= stageRecord+64; vlen++ {
			key := bytes.Repeat([]byte{'k'}, klen)
			value := make([]byte, vlen)
			for i := range value {
				value[i] = byte(i*7 + klen)
			}
			size := recordSize(klen, vlen)
			rec := bytes.Repeat([]byte{0xa5}, size)
			encodeRecord(rec, uint64(vlen)<<16|3, key, value)
			if want := inPlaceRecord(size, uint64(vlen)<<16|3, key, value); !bytes.Equal(rec, want) {
				t.Fatalf("key %d value %d bytes: encodeRecord wrote\n%x\nin place\n%x", klen, vlen, rec, want)
			}
			if recHdr+((klen+vlen+7)&^7)+8 <= stageRecord {
				staged++
			}
		}
	}
	if staged == 0 {
		t.Fatal("no record was small enough to be built on the stack: tested nothing")
	}
}
