"""kvfs.hf's prefix cache through real kvfs mounts, on the CPU.

A tiny random Llama (hf_model.py: built from a config, seeded, no download)
generates from prompts that share prefixes, with blocks deleted, evicted,
corrupted or stored under another tag, and with the daemon killed. Every
generation must give the same tokens and bit-identical logits as
hf_model.reference(): the same computation without kvfs (each whole block
prefilled in its own forward, as PrefixCache(prefill_blocks=1) does), so
whatever kvfs served or failed to serve, the answer is the model's own.

On a GPU machine the same tests run the GPU paths: KVFS_TEST_DEVICE=cuda
puts the model and prompts there, KVFS_TEST_PIN=1 makes every PrefixCache
pin=True (pinned host memory; without it, REGISTER_CUDA). The tests of the
GPU path on CPU tensors then skip.

KVFS_MOUNT (a mount of integration/ctl's TestPythonClient) serves the
tests that need only a mount; KVFS_BIN (the kvfs binary) lets the others
format a small store file and run their own daemon, which they corrupt,
fill past its size or kill. Skips without them, torch or transformers (an
error in CI, see conftest.py).
"""

import functools
import os
import shutil
import threading
import unittest
import warnings

import kvfs
import own_daemon

try:
    import torch
    import transformers  # noqa: F401
    import hf_model
    import kvfs.hf as khf
except ImportError:  # pragma: no cover
    torch = None

MOUNT = os.environ.get("KVFS_MOUNT")
BIN = os.environ.get("KVFS_BIN")
DEVICE = os.environ.get("KVFS_TEST_DEVICE", "cpu")
PIN = os.environ.get("KVFS_TEST_PIN") == "1"
BLOCKS, TAIL = 5, 3


def stats(mnt):
    import json
    with open(os.path.join(mnt, ".kvfs", "stats")) as f:
        return json.load(f)


def delete_block(mnt, block):
    """Remove a block through the mount (every layer's directory)."""
    for layer in sorted(os.listdir(mnt)):
        d = os.path.join(mnt, layer, "block-%016x" % block)
        if layer.startswith("layer-") and os.path.isdir(d):
            shutil.rmtree(d)


class _Base(unittest.TestCase):
    mnt = None

    def setUp(self):
        with kvfs.Client(self.mnt) as c:
            self.info = c.info()
        self.bt = self.info.block_tokens
        self.model = hf_model.for_info(self.info).to(DEVICE)

    def cache(self, **kw):
        # every test its own names: blocks other tests (or runs) stored never match
        if not hasattr(self, "_identity"):
            self._identity = "%s %s" % (self.id(), os.urandom(8).hex())
        kw.setdefault("identity", self._identity)
        kw.setdefault("prefill_blocks", 1)
        kw.setdefault("pin", PIN)
        return khf.PrefixCache(self.mnt, self.model, **kw)

    def prompt(self, seed, blocks=BLOCKS, tail=TAIL):
        return hf_model.prompt(blocks * self.bt + tail, seed).to(DEVICE)

    def check(self, pc, p, what=""):
        got = pc.generate(p, **hf_model.GEN)
        hf_model.assert_same(self, got, hf_model.reference(self.model, p, self.bt), what)
        return got

    def computed(self, ids):
        """Per layer (K, V) of the model's cache over ids' first BLOCKS whole blocks."""
        import kvfs.torch as kt
        from transformers import DynamicCache
        cache = DynamicCache()
        with torch.no_grad():
            self.model(input_ids=ids[:, :BLOCKS * self.bt], use_cache=True,
                       **{hf_model.cache_kw(self.model): cache})
        return kt._hf_layers(cache)

    def lookup_run(self, pc, p):
        with kvfs.Client(self.mnt) as c:
            return c.lookup([(k.block, k.tag) for k in pc.keys(p)]).run

    def layerwise_case(self, seed, **kw):
        """A prompt stored, then generated layer by layer (kw: PrefixCache's
        settings): full and partial hits, and a block deleted after layer 0
        loaded, which makes the forward start again."""
        p = self.prompt(seed)
        with self.cache() as pc:
            self.check(pc, p, "cold")
            keys = pc.keys(p)
        decoder = khf._decoder_layers(self.model)
        with self.cache(layerwise=True, **kw) as pc:
            self.check(pc, p, "layerwise")
            self.assertEqual((pc.stats["layerwise_loads"], pc.stats["loaded_blocks"]), (1, BLOCKS))
            self.assertEqual(pc.stats["layerwise_retries"], 0)
            # the loader's thread loaded layers after layer 0, and the hooks timed their waits
            self.assertGreater(pc.stats["layerwise_load_s"], 0)
            self.assertGreaterEqual(pc.stats["layerwise_wait_s"], 0)
            self.assertTrue(all(len(layer._forward_pre_hooks) == 0 for layer in decoder))
            if kw.get("pin"):
                self.assertEqual(pc._ring.slots, min(khf._Ring.SLOTS, self.info.layers))
            p2 = torch.cat([p[:, :2 * self.bt], self.prompt(seed + 1, 1, 9)], dim=1)
            self.check(pc, p2, "layerwise partial")
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS + 2)
            c = pc._client
            real = c.load_blocks

            deleted, layer_0 = threading.Lock(), threading.Event()

            def delete_after_layer_0(target, entries, details=False):
                # a BlockArray per load; the loads of later layers run on
                # several threads, some started while layer 0 loads: they wait
                # until layer 0 is in and the block deleted
                if entries.layer_first > 0:
                    layer_0.wait(30)
                    return real(target, entries, details)
                st = real(target, entries, details)
                if deleted.acquire(blocking=False):
                    delete_block(self.mnt, keys[3].block)
                layer_0.set()
                return st
            c.load_blocks = delete_after_layer_0
            try:
                self.check(pc, p, "layerwise, block gone after layer 0")
            finally:
                del c.load_blocks
            self.assertEqual(pc.stats["layerwise_retries"], 1)
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS + 2 + 3)
            self.assertTrue(all(len(layer._forward_pre_hooks) == 0 for layer in decoder))
            self.assertEqual(self.lookup_run(pc, p), BLOCKS)  # recomputed and stored again
        return pc


@unittest.skipUnless(torch is not None and MOUNT, "needs torch, transformers and KVFS_MOUNT")
class SharedMountTest(_Base):
    mnt = MOUNT

    def test_shared_prefixes(self):
        """A prompt's blocks serve the same prompt from another client, and a
        prompt sharing only its first blocks (a partial hit)."""
        p1 = self.prompt(11)
        with self.cache() as pc:
            self.check(pc, p1, "cold")
            self.assertEqual((pc.stats["hit_blocks"], pc.stats["stored_blocks"]), (0, BLOCKS))
            self.assertEqual(self.lookup_run(pc, p1), BLOCKS)
        before = stats(self.mnt)
        with self.cache() as pc:   # another process, as far as the daemon can tell
            self.check(pc, p1, "warm")
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS)
            self.assertEqual(pc.stats["stored_blocks"], 0)
            cache, n = pc.load(p1)
            self.assertEqual((n, cache.get_seq_length()), (BLOCKS * self.bt, BLOCKS * self.bt))
            # a prompt of whole blocks keeps its last one uncached: the model computes the next token's logits
            whole = p1[:, :4 * self.bt]
            self.assertEqual(pc.load(whole)[1], 3 * self.bt)
            self.check(pc, whole, "whole blocks")
            # 3 shared blocks, then others
            p2 = torch.cat([p1[:, :3 * self.bt], self.prompt(12, 2, 7)], dim=1)
            self.assertEqual(pc.cached_tokens(torch.cat([p1, p2[:, :p1.shape[1]]])), [BLOCKS * self.bt, 3 * self.bt])
            loaded = pc.stats["loaded_blocks"]
            self.check(pc, p2, "partial")
            self.assertEqual(pc.stats["loaded_blocks"] - loaded, 3)
            self.assertEqual(self.lookup_run(pc, p2), 5)
        # the daemon read them from the store
        self.assertGreater(stats(self.mnt)["store_hits"], before["store_hits"])

    def test_batch(self):
        """A batch of two prompts, each named by its own blocks: cold, every
        block of both is stored; warm, both load; with one sequence sharing
        only 3 blocks of what is stored, the cache holds the 3 blocks both
        have (batch 2) and the rest is recomputed. Each time the tokens and
        logits are the batch's own without kvfs."""
        import kvfs.torch as kt
        p1, p2 = self.prompt(21), self.prompt(22)
        batch = torch.cat([p1, p2])
        same = functools.partial(hf_model.assert_generated, self)
        want = hf_model.reference(self.model, batch, self.bt)
        with self.cache() as pc:
            same(pc.generate(batch, **hf_model.GEN), want, "cold")
            self.assertEqual((pc.stats["hit_blocks"], pc.stats["stored_blocks"]), (0, 2 * BLOCKS))
            self.assertEqual([self.lookup_run(pc, p) for p in (p1, p2)], [BLOCKS, BLOCKS])
        with self.cache() as pc:
            cache, n = pc.load(batch)
            self.assertEqual((n, tuple(kt._hf_layers(cache)[0][0].shape[:3])),
                             (BLOCKS * self.bt, (2, self.info.kv_heads, BLOCKS * self.bt)))
            same(pc.generate(batch, **hf_model.GEN), want, "warm")
            self.assertEqual((pc.stats["loaded_blocks"], pc.stats["stored_blocks"]), (4 * BLOCKS, 0))
            p3 = torch.cat([p2[:, :3 * self.bt], self.prompt(23, 2, TAIL)], dim=1)
            part = torch.cat([p1, p3])
            self.assertEqual(pc.load(part)[1], 3 * self.bt)
            loaded = pc.stats["loaded_blocks"]
            same(pc.generate(part, **hf_model.GEN), hf_model.reference(self.model, part, self.bt), "partial")
            self.assertEqual((pc.stats["loaded_blocks"] - loaded, pc.stats["stored_blocks"]), (2 * 3, 2))
            self.assertEqual(self.lookup_run(pc, p3), BLOCKS)

    def test_beams_and_return_sequences(self):
        """num_beams and num_return_sequences: model.generate runs that many
        rows per prompt, so generate() hands it a cache of each prompt's
        rows repeated (layer by layer too; on the CPU also through the
        pinned ring, on CPU tensors) and stores one row per prompt (in a
        batch, each prompt's own). Cold and warm, tokens and logits are
        those without kvfs."""
        import contextlib
        import kvfs.torch as kt
        import torch_on_cpu
        p = self.prompt(24)
        beams = dict(num_beams=3, num_return_sequences=2)
        modes = [(True, PIN), (False, PIN)] + ([(True, "ring")] if DEVICE == "cpu" else [])
        for i, (p, gen) in enumerate(((p, beams), (p, dict(do_sample=True, top_k=0, num_return_sequences=3)),
                                      (torch.cat([p, self.prompt(25)]), beams))):
            want = hf_model.reference(self.model, p, self.bt, seed=5, **gen)
            for layerwise, pin in modes:
                what = "%d prompts %s layerwise=%s pin=%s" % (p.shape[0], gen, layerwise, pin)
                ctx = torch_on_cpu.active(kt, torch) if pin == "ring" else contextlib.nullcontext()
                ident = "%s %d %s" % (self.id(), i, os.urandom(8).hex())
                with ctx, self.cache(layerwise=layerwise, pin=bool(pin), identity=ident) as pc:
                    for run in ("cold", "warm"):
                        torch.manual_seed(5)
                        got = pc.generate(p, **dict(hf_model.GEN, **gen))
                        self.assertEqual(got.sequences.shape[0], p.shape[0] * gen["num_return_sequences"], what)
                        hf_model.assert_generated(self, got, want, "%s %s" % (what, run))
                    self.assertEqual((pc.stats["stored_blocks"], pc.stats["loaded_blocks"]),
                                     (p.shape[0] * BLOCKS, p.shape[0] * BLOCKS), what)
                    self.assertEqual(pc.stats["layerwise_loads"], int(layerwise and p.shape[0] == 1), what)
                    if pin == "ring" and layerwise and p.shape[0] == 1:
                        self.assertIsNotNone(pc._ring, what)

    def test_cache_settings(self):
        """generate() makes the cache: a cache of the caller's, or a
        cache_implementation asked for, is refused with a clear error; a
        model whose generation config names a cache of its own (Gemma's
        "hybrid", say) gets the DynamicCache in its place, and the same
        answers."""
        from transformers import DynamicCache
        p = self.prompt(28)
        with self.cache() as pc:
            with self.assertRaisesRegex(ValueError, "cache of the caller"):
                pc.generate(p, **{hf_model.cache_kw(self.model): DynamicCache()}, **hf_model.GEN)
            with self.assertRaisesRegex(ValueError, "cache_implementation='static' cannot be used"):
                pc.generate(p, cache_implementation="static", **hf_model.GEN)
            self.model.generation_config.cache_implementation = "static"
            self.check(pc, p, "cold")
            self.check(pc, p, "warm")
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS)

    def test_next_turn_finds_the_answer(self):
        """generate() stores the whole blocks of the tokens it generated as
        well, so a conversation's next turn (prompt, answer, new message)
        loads the answer's blocks: the KV generation computed, bit for bit,
        so the next turn's tokens and logits are those of going on from
        that cache without kvfs. store_generated=False stores the prompt's
        blocks only."""
        from transformers import DynamicCache
        bt = self.bt
        new = 2 * bt + 8
        gen = dict(hf_model.GEN, max_new_tokens=new, min_new_tokens=new)
        p1 = self.prompt(26, 3, 3)
        c1 = DynamicCache()
        out1 = hf_model.reference(self.model, p1, bt, cache=c1, max_new_tokens=new, min_new_tokens=new)
        answered = out1.sequences.shape[1] - 1  # the last token's KV is not computed
        self.assertEqual(c1.get_seq_length(), answered)
        p2 = torch.cat([out1.sequences, self.prompt(27, 0, 20)], dim=1)
        c1.crop(-(answered % bt))  # whole blocks
        want = hf_model.reference(self.model, p2, bt, cache=c1, max_new_tokens=new, min_new_tokens=new)
        for store_generated, loads in ((True, answered // bt), (False, (p1.shape[1] - 1) // bt)):
            what = "store_generated=%s" % store_generated
            ident = "%s %s" % (self.id(), os.urandom(8).hex())
            with self.cache(store_generated=store_generated, identity=ident) as pc:
                got1 = pc.generate(p1, **gen)
                self.assertEqual(got1.sequences.tolist(), out1.sequences.tolist(), what)
                self.assertEqual(pc.stats["stored_blocks"], loads, what)
            with self.cache(store_generated=store_generated, identity=ident) as pc:
                got = pc.generate(p2, **gen)
                self.assertEqual(pc.stats["loaded_blocks"], loads, what)
                if store_generated:
                    hf_model.assert_generated(self, got, want, what)

    def test_one_thread_at_a_time(self):
        """A PrefixCache's buffers serve one call at a time: a call from a
        second thread while generate() runs is refused, and the first
        call's answer is its own."""
        import threading
        p = self.prompt(29)
        entered, release, out = threading.Event(), threading.Event(), []

        def hold(module, args):
            entered.set()
            release.wait(30)
        hook = khf._decoder_layers(self.model)[0].register_forward_pre_hook(hold)
        try:
            with self.cache() as pc:
                t = threading.Thread(target=lambda: out.append(pc.generate(p, **hf_model.GEN)))
                t.start()
                self.assertTrue(entered.wait(30))
                for call in (lambda: pc.load(p), lambda: pc.generate(p, **hf_model.GEN), lambda: pc.cached_tokens(p),
                             pc.close):
                    with self.assertRaisesRegex(RuntimeError, "one PrefixCache per thread"):
                        call()
                release.set()
                t.join(30)
                self.assertEqual(pc.cached_tokens(p), [BLOCKS * self.bt])  # free again
        finally:
            release.set()
            hook.remove()
        hf_model.assert_same(self, out[0], hf_model.reference(self.model, p, self.bt), "the first thread's")

    def test_mask_holes_and_no_cache_bypass_kvfs(self):
        """A mask that hides tokens amid the prompt makes KV the stored blocks
        do not hold, and use_cache=False recomputes every token at every
        step (a cache given would be attended twice): generate() is
        model.generate's own, kvfs untouched."""
        p = self.prompt(14)
        mask = torch.ones_like(p)
        mask[0, 20:22] = 0
        with self.cache() as pc:
            self.check(pc, p, "cold")
            for what, kw in (("masked", dict(attention_mask=mask)), ("use_cache=False", dict(use_cache=False))):
                with torch.no_grad():
                    want = self.model.generate(p, **dict(dict(attention_mask=torch.ones_like(p)), **kw),
                                               **hf_model.GEN)
                got = pc.generate(p, **kw, **hf_model.GEN)
                hf_model.assert_same(self, got, want, what)
                self.assertEqual((pc.stats["lookups"], pc.stats["loaded_blocks"]), (1, 0), what)

    def test_given_client(self):
        """With a Client of the caller's: close() unmaps and unregisters the
        host buffer and leaves the client open."""
        p = self.prompt(13)
        with kvfs.Client(self.mnt) as c:
            pc = khf.PrefixCache(c, self.model, prefill_blocks=1, identity=self.id() + os.urandom(8).hex(),
                                 pin=PIN)
            self.check(pc, p, "cold")
            self.check(pc, p, "warm")
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS)
            if DEVICE == "cpu":
                mm = pc._host[0].mm
            else:  # pin=True: the pinned staging of the one-call load's cache
                mm = pc._area.kcs[0]._host.mm if PIN else None
            pc.close()
            self.assertTrue(mm is None or mm.closed)
            self.assertEqual(c._owned, set(c._free_arrays))
            self.assertEqual(c.lookup([(k.block, k.tag) for k in pc.keys(p)]).run, BLOCKS)

    def test_deleted_block_ends_the_prefix(self):
        p = self.prompt(21)
        with self.cache() as pc:
            self.check(pc, p, "cold")
            keys = pc.keys(p)
            delete_block(self.mnt, keys[2].block)
            self.assertEqual(self.lookup_run(pc, p), 2)
            self.check(pc, p, "after delete")
            self.assertEqual(pc.stats["loaded_blocks"], 2)
            # the recomputed block is stored again, under its parent
            self.assertEqual(pc.stats["stored_blocks"], BLOCKS + 1)
            self.assertEqual(self.lookup_run(pc, p), BLOCKS)

    def test_evicted_between_lookup_and_load(self):
        """LOOKUP's answer is a snapshot: a block gone by the LOAD ends the prefix there."""
        p = self.prompt(31)
        with self.cache() as pc:
            self.check(pc, p, "cold")
            keys = pc.keys(p)
            c = pc._client
            real = c.lookup

            def lookup_then_delete(pairs):
                r = real(pairs)
                delete_block(self.mnt, keys[1].block)
                return r
            c.lookup = lookup_then_delete
            try:
                self.check(pc, p, "evicted mid-way")
            finally:
                del c.lookup
            self.assertEqual(pc.stats["hit_blocks"], BLOCKS)
            self.assertEqual(pc.stats["loaded_blocks"], 1)
            self.assertEqual(pc.stats["failed_blocks"], BLOCKS - 1)

    def test_block_under_another_tag(self):
        """A block id stored under another tag (a collision) is never served:
        LOOKUP says so, and a LOAD that expects the tag gets TAG_MISMATCH."""
        p = self.prompt(41)
        with self.cache() as pc:
            self.check(pc, p, "cold")
            keys = pc.keys(p)
            c = pc._client
            i = self.info
            with c.create_host_buffer(2 * i.layers * i.kv_heads * self.bt * i.row_bytes) as buf:
                region = i.kv_heads * self.bt * i.row_bytes
                t = c.hf_target(self.bt, [(buf.id, r * region) for r in range(2 * i.layers)])
                tid = c.register_target(t)
                other = b"\xee" * 16
                self.assertEqual(c.store_blocks((t, tid), [kvfs.BlockEntry(keys[2].block, 0, tag=other,
                                                                            parent=keys[1].block)]), [kvfs.OK])
                st = c.load_blocks((t, tid), [kvfs.BlockEntry(keys[2].block, 0, tag=keys[2].tag)], details=True)
                self.assertEqual(st[0][:2], (kvfs.ABSENT, kvfs.TAG_MISMATCH))
                c.unregister_target(tid)
            r = c.lookup([(k.block, k.tag) for k in keys])
            self.assertEqual((r.run, r.statuses[2], r.mismatch), (2, kvfs.LOOKUP_TAG_MISMATCH, 1))
            # a LOOKUP that missed the collision: the load's tag check ends the prefix
            real = c.lookup
            c.lookup = lambda pairs: r._replace(statuses=[kvfs.LOOKUP_PRESENT] * len(pairs), run=len(pairs))
            try:
                self.check(pc, p, "mismatch on load")
            finally:
                del c.lookup
            self.assertEqual(pc.stats["loaded_blocks"], 2)
            self.assertEqual(real([(keys[2].block, keys[2].tag)]).run, 0)
            # with LOOKUP's true answer the block is recomputed and stored again under its own tag
            self.check(pc, p, "mismatch found by lookup")
            self.assertEqual(pc.stats["loaded_blocks"], 4)
            self.assertEqual(self.lookup_run(pc, p), BLOCKS)

    def test_layerwise(self):
        """Layer 0 loaded first, the others on threads while the model runs
        (several layers a load, and one; loads in flight at once: two, the
        default, one, three): the same answers; a block gone by the time
        a later layer loads (after layer 0 found it) makes the forward start
        again from the blocks every layer has."""
        for per, flight in ((4, 2), (1, 1), (1, 3)):
            self.layerwise_case(81 + 2 * per + flight, layers_per_load=per, loads_in_flight=flight)

    def test_loads_in_flight_from_the_start(self):
        """With two loads in flight, a load of later layers is in flight
        while layer 0 loads (layer 0's load here waits, 10 s at most, for
        one to start), and the answer is the same."""
        p = self.prompt(131)
        with self.cache() as pc:
            self.check(pc, p, "cold")
        with self.cache(layerwise=True, loads_in_flight=2) as pc:
            if pc.pin:
                self.skipTest("pin=True's layer-by-layer loads go one at a time through its ring")
            c = pc._connect()
            real, later, seen = c.load_blocks, threading.Event(), []

            def load(target, entries, details=False):
                if entries.layer_first == 0:
                    seen.append(later.wait(10))
                else:
                    later.set()
                return real(target, entries, details)
            c.load_blocks = load
            try:
                self.check(pc, p, "two in flight")
            finally:
                del c.load_blocks
            self.assertEqual(seen, [True])
            self.assertEqual((pc.stats["layerwise_loads"], pc.stats["layerwise_retries"]), (1, 0))
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS)

    def test_layerwise_load_fails_after_layer_0(self):
        """A LOAD_BLOCKS after layer 0's fails (the daemon gone mid-hit), with
        one load in flight and with two: generation recomputes, gives the
        recompute's tokens and warns once; no hook stays on the model, and the
        next call finds the prefix again."""
        import errno
        p = self.prompt(121)
        with self.cache() as pc:
            self.check(pc, p, "cold")
        decoder = khf._decoder_layers(self.model)
        for flight in (1, 2):
            with self.cache(layerwise=True, loads_in_flight=flight) as pc:
                c = pc._connect()
                real = c.load_blocks

                def fail_after_layer_0(target, entries, details=False):
                    if entries.layer_first > 0:
                        raise kvfs.KvfsError("load-blocks", errno.ENOTCONN)
                    return real(target, entries, details)
                c.load_blocks = fail_after_layer_0
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    self.check(pc, p, "load failed after layer 0, %d in flight" % flight)
                msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
                self.assertEqual(len(msgs), 1, msgs)
                self.assertIn("load failed", msgs[0])
                self.assertEqual((pc.stats["fallbacks"], pc.stats["layerwise_retries"]), (1, 1))
                self.assertEqual(pc.stats["loaded_blocks"], 0)
                self.assertTrue(all(len(layer._forward_pre_hooks) == 0 for layer in decoder))
                # the failing client was closed with the outage; a new one serves the hit
                self.assertIsNot(pc._connect(), c)
                self.check(pc, p, "after the outage, %d in flight" % flight)
                self.assertEqual(pc.stats["loaded_blocks"], BLOCKS)

    @unittest.skipIf(DEVICE != "cpu", "the GPU path runs on the GPU itself")
    def test_layerwise_pinned_ring_on_cpu_tensors(self):
        """pin=True's layer-by-layer path (layers through pinned host slots,
        copied into the load area on a copy stream) on CPU tensors through
        torch_on_cpu, with 2 slots for 4 layers so that slots are reused:
        the same answers and the same retry as test_layerwise."""
        import kvfs.torch as kt
        import torch_on_cpu
        slots = khf._Ring.SLOTS
        try:
            # 2 slots: one layer a load, slots reused; 4: two layers a load
            for khf._Ring.SLOTS in (2, 4):
                with torch_on_cpu.active(kt, torch):
                    self.assertGreater(self.info.layers, 2)
                    pc = self.layerwise_case(83 + khf._Ring.SLOTS, pin=True)
                    self.assertEqual((pc._ring, pc._area), (None, None))  # closed
        finally:
            khf._Ring.SLOTS = slots

    @unittest.skipIf(DEVICE != "cpu", "the GPU path runs on the GPU itself")
    def test_gpu_path_on_cpu_tensors(self):
        """kvfs.hf's GPU path (kvfs.torch, pin=True: the staging buffer) on
        CPU tensors through torch_on_cpu: tagged stores with parents, tagged
        loads that stop at a wrong tag, the bytes the model computed."""
        import kvfs.torch as kt
        import torch_on_cpu
        p = self.prompt(91)
        layers = self.computed(p)
        with torch_on_cpu.active(kt, torch):
            with self.cache(pin=True) as pc:
                keys = pc.keys(p)
                self.assertEqual(pc._store_torch(keys, list(range(1, BLOCKS)), layers), BLOCKS - 1)
                self.assertEqual(pc._store_torch(keys, [0], layers), 1)
                self.assertEqual(self.lookup_run(pc, p), BLOCKS)
                got, m = pc._load_torch(keys, torch.device("cpu"))
                self.assertEqual(m, BLOCKS)
                for (k, v), (wk, wv) in zip(got, layers):
                    self.assertTrue(torch.equal(k, wk) and torch.equal(v, wv))
                wrong = list(keys)
                wrong[2] = khf.BlockKey(keys[2].block, b"w" * 16, keys[2].parent)
                got, m = pc._load_torch(wrong, torch.device("cpu"))
                self.assertEqual(m, 2)
                self.assertTrue(torch.equal(got[1][0], layers[1][0][:, :, :2 * self.bt]))

    @unittest.skipIf(DEVICE != "cpu", "the GPU path runs on the GPU itself")
    def test_gpu_path_batch_on_cpu_tensors(self):
        """The GPU path for a batch of two: each sequence stored from its
        batch row, both loaded into one cache of batch 2 (one load per row),
        the prefix they share (3 blocks of the second sequence under a wrong
        tag: the first 3 blocks of both)."""
        import kvfs.torch as kt
        import torch_on_cpu
        batch = torch.cat([self.prompt(92), self.prompt(93)])
        layers = self.computed(batch)
        with torch_on_cpu.active(kt, torch):
            with self.cache(pin=True) as pc:
                keys = pc.keys(batch)
                self.assertEqual(len(keys), 2)
                for b in range(2):
                    self.assertEqual(pc._store_torch(keys[b], list(range(BLOCKS)), layers, b), BLOCKS)
                got, m = pc._load_torch(keys, torch.device("cpu"))
                self.assertEqual(m, BLOCKS)
                for (k, v), (wk, wv) in zip(got, layers):
                    self.assertTrue(torch.equal(k, wk) and torch.equal(v, wv))
                wrong = [keys[0], list(keys[1])]
                wrong[1][3] = khf.BlockKey(keys[1][3].block, b"w" * 16, keys[1][3].parent)
                got, m = pc._load_torch(wrong, torch.device("cpu"))
                self.assertEqual(m, 3)
                self.assertTrue(torch.equal(got[0][1], layers[0][1][:, :, :3 * self.bt]))


@unittest.skipUnless(torch is not None and BIN, "needs torch, transformers and KVFS_BIN")
class OwnDaemonTest(_Base):
    GEOMETRY = (4, 2, 128, 16, "bf16")

    def daemon(self, size="16MiB", geometry=GEOMETRY):
        d = own_daemon.Daemon(size, geometry)
        self.addCleanup(d.close)
        self.mnt = d.mnt
        _Base.setUp(self)
        return d

    def setUp(self):
        pass

    def test_eviction(self):
        """A store too small for two prompts evicts the first's tail; the
        rest of its blocks still serve it."""
        d = self.daemon("640KiB")
        slots = stats(d.mnt)["slots"]
        self.assertLess(slots, 2 * BLOCKS)
        p1, p2 = self.prompt(51), self.prompt(52)
        with self.cache() as pc:
            self.check(pc, p1, "first")
            self.check(pc, p2, "second")
            self.assertGreaterEqual(stats(d.mnt)["store_evictions"], 2 * BLOCKS - slots)
            run = self.lookup_run(pc, p1)
            self.assertLess(run, BLOCKS)
            loaded = pc.stats["loaded_blocks"]
            self.check(pc, p1, "first again")
            self.assertEqual(pc.stats["loaded_blocks"] - loaded, run)

    def test_corrupt_group(self):
        """Garbage in one group's payload in the store file: its CRC fails,
        the prefix ends at its block."""
        d = self.daemon()
        p = self.prompt(61)
        with self.cache() as pc:
            self.check(pc, p, "cold")
            keys = pc.keys(p)
            path = pc._client.group_path(d.mnt, keys[3].block, 1, 0, "V")
            with open(path, "rb") as f:
                payload = f.read()
            with open(d.store, "r+b") as f:
                img = f.read()
                at = img.find(payload)
                self.assertGreater(at, 0)
                self.assertEqual(img.find(payload, at + 1), -1, "the group's bytes are not unique in the store")
                f.seek(at + 100)
                f.write(bytes(b ^ 0x5A for b in payload[100:164]))
            before = stats(d.mnt)["store_corrupt"]
            self.check(pc, p, "corrupt")
            self.assertEqual(pc.stats["loaded_blocks"], 3)
            self.assertGreater(stats(d.mnt)["store_corrupt"], before)

    def test_layerwise_groups(self):
        """A 12-layer model loads layer 0, then 1, 2, 4, 1, 2 and 1 layers a
        LOAD_BLOCKS: the same answers and the same retry as test_layerwise;
        on the CPU also through the pinned ring on CPU tensors (8 slots: up
        to 4 layers a load, slots reused)."""
        import kvfs.torch as kt
        import torch_on_cpu
        self.daemon("32MiB", geometry=(12, 2, 32, 16, "bf16"))
        self.assertEqual([n for _, n in khf._layer_groups(12, 4)], [1, 2, 4, 1, 2, 1])
        loads = []
        real = kvfs.Client.load_blocks

        def counted(c, target, entries, details=False):
            if isinstance(entries, kvfs.BlockArray):
                loads.append(entries.layer_count)
            return real(c, target, entries, details)
        kvfs.Client.load_blocks = counted
        try:
            self.layerwise_case(95)
            # through the pinned ring (pin=True on a GPU) a load takes at
            # most half its slots
            self.assertIn(min(4, khf._Ring.SLOTS // 2) if PIN else 4, loads)
            if DEVICE == "cpu":
                slots = khf._Ring.SLOTS
                khf._Ring.SLOTS = 8
                try:
                    with torch_on_cpu.active(kt, torch):
                        self.layerwise_case(97, pin=True)
                finally:
                    khf._Ring.SLOTS = slots
        finally:
            kvfs.Client.load_blocks = real

    def test_default_prefill_fp32(self):
        """The default PrefixCache (the uncached rest prefilled in one
        forward, as model.generate does): generation from stored blocks
        gives the same tokens as plain model.generate, and logits within
        1e-4 (an fp32 store and model: KV computed over other shapes differs
        only in the last bits); a cold run is bit-identical to it."""
        self.daemon(geometry=(4, 2, 64, 16, "fp32"))
        p1 = self.prompt(101)
        p2 = torch.cat([p1[:, :3 * self.bt], self.prompt(102, 1, 11)], dim=1)
        for layerwise in (False, True):
            with self.cache(identity="default %s" % layerwise, layerwise=layerwise, prefill_blocks=None) as pc:
                hf_model.assert_same(self, pc.generate(p1, **hf_model.GEN), hf_model.plain(self.model, p1),
                                     "cold layerwise=%s" % layerwise)
                for p, hit in ((p1, BLOCKS), (p2, 3)):
                    loaded = pc.stats["loaded_blocks"]
                    got, want = pc.generate(p, **hf_model.GEN), hf_model.plain(self.model, p)
                    self.assertEqual(pc.stats["loaded_blocks"] - loaded, hit)
                    hf_model.assert_generated(self, got, want, "hit of %d blocks" % hit, tol=1e-4)

    def test_left_padded_batch_fp32(self):
        """A left-padded batch (prompts of other lengths, as a tokenizer pads
        them) is named by each prompt's tokens after its pads: cold, each
        prompt's blocks are stored (from the columns after its pads) and
        serve it alone; warm, each row holds its own stored blocks after its
        pads, every row cut where the first runs out, the pads zero. The
        generation is plain model.generate's (the same tokens, logits
        within 1e-4: an fp32 store and model). On the CPU also through the
        GPU path (pin=True's staging, on CPU tensors)."""
        import contextlib
        import kvfs.torch as kt
        import torch_on_cpu
        self.daemon(geometry=(4, 2, 64, 16, "fp32"))
        bt = self.bt
        p1, p2 = self.prompt(111), self.prompt(112, 3, 7)
        pad = p1.shape[1] - p2.shape[1]
        batch = torch.cat([p1, torch.cat([torch.zeros((1, pad), dtype=p2.dtype, device=p2.device), p2], dim=1)])
        mask = torch.ones_like(batch)
        mask[1, :pad] = 0
        hole = torch.ones_like(mask)
        hole[0, 3] = 0
        same = functools.partial(hf_model.assert_generated, self, tol=1e-4)
        with torch.no_grad():
            want = self.model.generate(batch, attention_mask=mask, **hf_model.GEN)
        for pin in [PIN] + (["staging"] if DEVICE == "cpu" else []):
            ctx = torch_on_cpu.active(kt, torch) if pin == "staging" else contextlib.nullcontext()
            kw = dict(prefill_blocks=None, pin=bool(pin), identity="%s %s" % (self.id(), pin))
            with ctx:
                with self.cache(**kw) as pc:
                    same(pc.generate(batch, attention_mask=mask, **hf_model.GEN), want, "cold pin=%s" % pin)
                    self.assertEqual((pc.stats["loaded_blocks"], pc.stats["stored_blocks"]), (0, BLOCKS + 3))
                    self.assertEqual([self.lookup_run(pc, p) for p in (p1, p2)], [BLOCKS, 3])
                    self.assertEqual(pc.cached_tokens(batch, attention_mask=mask), [BLOCKS * bt, 3 * bt])
                    self.assertEqual(pc.cached_tokens(batch), [BLOCKS * bt, 0])  # row 2 with its pads: not stored
                with self.cache(**kw) as pc:
                    alone1, alone2 = (kt._hf_layers(pc.load(p)[0]) for p in (p1, p2))
                    cache, end = pc.load(batch, attention_mask=mask)
                    self.assertEqual(end, pad + 3 * bt)   # p2's 3 blocks end first
                    with self.assertRaisesRegex(ValueError, "left padding only"):
                        pc.load(batch, attention_mask=hole)
                    for (k, v), (k1, v1), (k2, v2) in zip(kt._hf_layers(cache), alone1, alone2):
                        self.assertEqual(tuple(k.shape), (2, self.info.kv_heads, end, self.info.row_bytes // 4))
                        self.assertTrue(torch.equal(k[0], k1[0, :, :end]) and torch.equal(v[0], v1[0, :, :end]))
                        self.assertTrue(torch.equal(k[1, :, pad:], k2[0]) and torch.equal(v[1, :, pad:], v2[0]))
                        self.assertFalse(k[1, :, :pad].any() or v[1, :, :pad].any())
                    loaded = pc.stats["loaded_blocks"]
                    same(pc.generate(batch, attention_mask=mask, **hf_model.GEN), want, "warm pin=%s" % pin)
                    self.assertEqual(pc.stats["loaded_blocks"] - loaded, -(-end // bt) + 3)
                    # the rows the batch stored serve each prompt alone
                    for p, hit in ((p1, BLOCKS), (p2, 3)):
                        loaded = pc.stats["loaded_blocks"]
                        same(pc.generate(p, **hf_model.GEN), hf_model.plain(self.model, p), "alone pin=%s" % pin)
                        self.assertEqual(pc.stats["loaded_blocks"] - loaded, hit)

    def test_daemon_killed(self):
        """A daemon killed between generations: recompute with one warning;
        a new daemon on the same store is used again."""
        d = self.daemon()
        p = self.prompt(71)
        with self.cache() as pc:
            self.check(pc, p, "cold")
            d.kill()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                self.check(pc, p, "daemon killed")
                self.assertEqual(pc.cached_tokens(p), [0])
                self.check(pc, p, "still down")
                with self.cache() as pc2:     # opened while the mount is dead
                    got = pc2.generate(p, **hf_model.GEN)
            msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
            self.assertEqual(len(msgs), 2, msgs)   # one per PrefixCache and outage
            hf_model.assert_same(self, got, hf_model.plain(self.model, p), "never connected")
            self.assertEqual(pc.stats["loaded_blocks"], 0)
            self.assertGreater(pc.stats["fallbacks"], 0)
            d.start()   # kvfs mount detaches the dead mount first
            self.assertEqual(pc.cached_tokens(p), [BLOCKS * self.bt])
            self.check(pc, p, "daemon back")
            self.assertEqual(pc.stats["loaded_blocks"], BLOCKS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
