package testutil

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The layout of a file store's message blocks (nats-server's filestore.go:
// msgHdrSize, hbit, ebit, tbit): each record begins with its length (its
// top bit set when it has headers), its sequence (the erase and tombstone
// bits in its top two) and its time, then the subject's length; a
// stream's state besides its blocks is in msgs/index.db, which the server
// rebuilds from the blocks when it is missing.
const (
	blockRecordHeader = 22
	blockHeadersBit   = 1 << 31
	blockEraseBit     = 1 << 63
	blockTombstoneBit = 1 << 62
)

// LoseTail makes the storage of the stopped server lose the last n
// messages of stream (of the global account, as a server without
// accounts keeps it): what a server that crashed before it synced them
// to disk starts with, the fault Jepsen's analysis of NATS 2.12.1 found
// (acknowledged messages gone, and the stream's last sequence back where
// it was before them, so that the next messages take their sequences).
// The stream keeps its creation time: to a client it is the same stream.
// It returns the sequences lost, oldest first.
func (s *NATSServer) LoseTail(stream string, n int) []uint64 {
	s.tb.Helper()
	if s.Server != nil {
		s.tb.Fatal("LoseTail needs the server stopped")
	}
	dir := filepath.Join(s.opts.StoreDir, "jetstream", "$G", "streams", stream, "msgs")
	blocks, err := blockFiles(dir)
	if err != nil {
		s.tb.Fatalf("lose the tail of stream %s: %v", stream, err)
	}
	if len(blocks) == 0 {
		s.tb.Fatalf("lose the tail of stream %s: no message block in %s", stream, dir)
	}
	last := blocks[len(blocks)-1]
	buf, err := os.ReadFile(last)
	if err != nil {
		s.tb.Fatal(err)
	}
	offs, seqs, err := blockRecords(buf)
	if err != nil {
		s.tb.Fatalf("lose the tail of stream %s: %s: %v", stream, last, err)
	}
	if n > len(seqs) {
		// A tail across blocks is not needed yet, and would be untested.
		s.tb.Fatalf("stream %s's last block holds %d messages, fewer than the %d to lose", stream, len(seqs), n)
	}
	cut := len(seqs) - n
	lost := slices.Clone(seqs[cut:])
	if err := os.Truncate(last, int64(offs[cut])); err != nil {
		s.tb.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "index.db")); err != nil && !os.IsNotExist(err) {
		s.tb.Fatal(err)
	}
	return lost
}

// blockFiles returns the paths of the message blocks in dir, in their
// order.
func blockFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type block struct {
		index int
		path  string
	}
	var bs []block
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".blk")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(name)
		if err != nil {
			return nil, fmt.Errorf("block file %s: %w", e.Name(), err)
		}
		bs = append(bs, block{i, filepath.Join(dir, e.Name())})
	}
	slices.SortFunc(bs, func(a, b block) int { return a.index - b.index })
	paths := make([]string, len(bs))
	for i, b := range bs {
		paths[i] = b.path
	}
	return paths, nil
}

// blockRecords returns the offsets and sequences of the messages a block
// holds (not its tombstones nor its erased messages), in its order.
func blockRecords(buf []byte) (offs []int, seqs []uint64, err error) {
	le := binary.LittleEndian
	for off := 0; off < len(buf); {
		if off+blockRecordHeader > len(buf) {
			return nil, nil, fmt.Errorf("a record's header overruns the block at %d", off)
		}
		rl := int(le.Uint32(buf[off:]) &^ blockHeadersBit)
		if rl < blockRecordHeader || off+rl > len(buf) {
			return nil, nil, fmt.Errorf("a record of length %d at %d of %d", rl, off, len(buf))
		}
		if seq := le.Uint64(buf[off+4:]); seq&(blockEraseBit|blockTombstoneBit) == 0 && seq != 0 {
			offs, seqs = append(offs, off), append(seqs, seq)
		}
		off += rl
	}
	return offs, seqs, nil
}
