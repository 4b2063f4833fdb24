package uplink

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// replayer replays the outbox round by round. The deletion of a round's
// acknowledged entries runs in the background while the next round is
// read and sent (the entries being deleted are skipped meanwhile), so the
// outbox's local write overlaps the store's work. At most one deletion is
// in flight.
type replayer struct {
	u    *Uplink
	prev *removal
}

// replayChunks is how many batches of MaxBatch writes a replay round
// sends per shard (one after the other), so that rounds are few.
const replayChunks = 4

// chunk is one replay batch: the writes of records of one shard.
type chunk struct {
	shard  int
	tws    []timedWrite
	recs   []record
	lapsed int // lapsed writes of recs, dropped with them
}

// removal is a background deletion of outbox entries.
type removal struct {
	skip map[uint64]bool // sequence numbers of the entries being deleted
	done chan struct{}
}

// wait returns when no deletion is in flight.
func (r *replayer) wait() {
	if r.prev != nil {
		<-r.prev.done
		r.prev = nil
	}
}

// round sends one round of the outbox entries of the shards that are up,
// oldest entries first: per shard about replayChunks batches of at most
// MaxBatch writes each (Batch.Replay), in as many writes, each carrying
// the next batch of every such shard (one round trip each), ages
// recomputed just before each. Evidence whose lease ran out more than
// the gateway grace ago, and a leave whose lease ran out, are dropped,
// never sent. An entry is deleted only after the store
// acknowledged its batch (a crash in between replays it again, which the
// store tolerates), or when all of it lapsed or the store refused it for
// good. The entries of a shard that is down wait for a probe of it to
// succeed. It returns the first error of a store that did not answer.
func (r *replayer) round(ctx context.Context) error {
	u := r.u
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	t := u.timing()
	var skip map[uint64]bool
	if r.prev != nil {
		skip = r.prev.skip
	}
	want := make([]bool, u.shards)
	for sh := range want {
		want[sh] = u.ob.holds(sh) && u.shardUp(sh)
	}
	if !slices.Contains(want, true) {
		r.wait()
		return nil
	}
	perShard, unknown, bad, err := u.ob.oldestRecords(want, replayChunks*t.maxBatch, replayChunks*t.maxBatch*u.shards, skip)
	if err != nil {
		return err
	}
	now := u.clock.Now()
	var (
		chunked [][]chunk
		gone    []record // entries to delete
		lapsed  int      // lapsed writes of gone
		unaged  int      // writes of unknown age (of unknown)
	)
	for _, rec := range unknown {
		gone = append(gone, rec)
		unaged += rec.n()
	}
	for shard, recs := range perShard {
		var chunks []chunk
		c := chunk{shard: shard}
		for _, rec := range recs {
			live := rec.item
			if !live.leave.IsZero() && now.Sub(live.leave) >= cmp.Or(live.leaveLease, t.lease) {
				live.leave = time.Time{}
			}
			if live.kind != 0 && now.Sub(live.at) >= cmp.Or(live.kindLease, t.lease)+u.grace {
				live.kind, live.at = 0, time.Time{}
			}
			if live.n() == 0 {
				gone = append(gone, rec)
				lapsed += rec.n()
				continue
			}
			if len(c.tws)+live.n() > t.maxBatch {
				chunks = append(chunks, c)
				c = chunk{shard: shard}
			}
			c.recs = append(c.recs, rec)
			c.lapsed += rec.n() - live.n()
			c.tws = appendWrites(c.tws, []item{live})
		}
		if len(c.tws) > 0 {
			chunks = append(chunks, c)
		}
		if len(chunks) > 0 {
			chunked = append(chunked, chunks)
		}
	}
	// Round k sends the k-th chunk of every shard that has one and whose
	// earlier chunks were taken, all in one write.
	var first error
	failed := make([]bool, len(chunked))
	for k := 0; ; k++ {
		var (
			ws   []shardWrites
			jobs []int
		)
		for j, chunks := range chunked {
			if k < len(chunks) && !failed[j] {
				ws = append(ws, shardWrites{shard: chunks[k].shard, tws: chunks[k].tws})
				jobs = append(jobs, j)
			}
		}
		if len(ws) == 0 {
			break
		}
		for i, err := range u.write(ctx, t, replayWrite, ws) {
			c := chunked[jobs[i]][k]
			if err != nil {
				failed[jobs[i]] = true
				first = cmp.Or(first, err)
				continue
			}
			gone = append(gone, c.recs...)
			lapsed += c.lapsed
		}
	}
	r.wait()
	if lapsed > 0 {
		u.lapsed.Add(uint64(lapsed))
		u.m.dropped.WithLabelValues(reasonLapsed).Add(float64(lapsed))
	}
	u.countUnknownAge(unaged)
	if len(gone) == 0 && len(bad) == 0 {
		return first
	}
	rm := &removal{skip: make(map[uint64]bool, len(gone)+len(bad)), done: make(chan struct{})}
	for _, rec := range gone {
		rm.skip[rec.seq] = true
	}
	for _, tk := range bad {
		rm.skip[seqOf(tk)] = true
	}
	go func() {
		defer close(rm.done)
		if err := u.ob.remove(gone, bad); err != nil {
			u.log.Error("outbox: deleting replayed entries failed; they will be replayed again", "err", err)
		}
	}()
	r.prev = rm
	return first
}
