"""numpy re-implementation of Megatron's GPT dataset indices (megatron/core/datasets/), the
independent side of tessera's GPT dataset tests.

It follows Megatron core_r0.10.0 (gpt_dataset.py, blended_dataset.py,
blended_megatron_dataset_builder.py, blended_megatron_dataset_config.py, utils.py and
helpers.cpp's build_sample_idx / build_blending_indices / build_exhaustive_blending_indices,
ported to Python), with numpy.random.RandomState for every shuffle and
numpy.random.default_rng for the mock data. It reads the .bin/.idx files with its own parser.

  python3 gpt_dataset_reference.py --manifest M.json   check the cases C++ built (see below)
  python3 gpt_dataset_reference.py --rng DIR            check MT19937/PCG64 outputs in DIR

The manifest (written by tests/unit/data/data_gpt_dataset_test.cpp) lists cases: the config
(blend, split, seed, sizes, tokenizer identity, cache folder) and, per split, what tessera
built: the cache base names and the samples it read for some indices. For each case this
script rebuilds everything, then checks that tessera's cache holds files under the same
names (MD5 of the same description text), that np.load gives identical arrays (dtype, shape,
values), that the .npy bytes equal numpy.save's, and that the samples are equal.
Exit status 0 when everything matches.
"""
import argparse
import functools
import hashlib
import io
import json
import math
import os
import re
import struct
import sys
from collections import OrderedDict

import numpy

SPLITS = ["train", "valid", "test"]


# ---- indexed dataset (megatron/core/datasets/indexed_dataset.py) -------------------------

DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


class IndexedDataset:
    def __init__(self, prefix):
        self.path_prefix = prefix
        with open(prefix + ".idx", "rb") as f:
            data = f.read()
        assert data[:9] == b"MMIDIDX\x00\x00", prefix
        (version,) = struct.unpack("<Q", data[9:17])
        assert version == 1
        self.dtype = DTYPES[data[17]]
        (s,) = struct.unpack("<Q", data[18:26])
        (d,) = struct.unpack("<Q", data[26:34])
        off = 34
        self.sequence_lengths = numpy.frombuffer(data, dtype=numpy.int32, count=s, offset=off)
        off += 4 * s
        self.sequence_pointers = numpy.frombuffer(data, dtype=numpy.int64, count=s, offset=off)
        self.bin = numpy.memmap(prefix + ".bin", dtype=numpy.uint8, mode="r")

    def __len__(self):
        return len(self.sequence_lengths)

    def get(self, idx, offset=0, length=None):
        if length is None:
            length = self.sequence_lengths[idx] - offset
        item = numpy.dtype(self.dtype).itemsize
        start = int(self.sequence_pointers[idx]) + int(offset) * item
        return numpy.frombuffer(self.bin[start:start + int(length) * item].tobytes(), dtype=self.dtype)


class MockLowLevelDataset:
    seed = 0
    size = 100000
    max_sequence_length = 4096

    def __init__(self, eod):
        self.eod = eod
        rng = numpy.random.default_rng(seed=self.seed)
        self.sequence_lengths = rng.integers(low=1, high=self.max_sequence_length, size=self.size,
                                             dtype=numpy.int32)
        self.path_prefix = None

    def __len__(self):
        return self.size

    def get(self, idx, offset=0, length=None):
        n = self.sequence_lengths[idx]
        if length is None:
            length = n - offset
        sample = numpy.int64(numpy.concatenate([numpy.arange(n - 1) + 1, [self.eod]]))
        return sample[offset:offset + length]


# ---- config helpers (utils.py, blended_megatron_dataset_config.py) -----------------------

def normalize(weights):
    w = numpy.array(weights, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def parse_and_normalize_split(split):
    split = list(map(float, re.findall(r"[.0-9]+", split)))
    split = split + [0.0 for _ in range(3 - len(split))]
    assert len(split) == 3 and all(x >= 0.0 for x in split)
    return normalize(split)


def convert_split_vector_to_split_matrix(vector_a):
    expansion = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *vector_a])
    bookends = list(zip(expansion[:-1], expansion[1:]))
    matrix = []
    for a in bookends:
        matrix.append(None if min(a[1], a[1]) <= max(a[0], a[0]) else (max(a[0], a[0]), min(a[1], a[1])))
    return matrix


class Tokenizer:
    def __init__(self, ident):
        self.unique_identifiers = OrderedDict(ident)


class Config:
    def __init__(self, case):
        self.random_seed = case["seed"]
        self.sequence_length = case["seq_length"]
        self.path_to_cache = case.get("cache_dir")
        self.tokenizer = Tokenizer(case["tokenizer"])
        self.eod = case["eod"]
        self.renormalize_blend_weights = case.get("renormalize", False)
        self.drop_last_partial_validation_sequence = case.get("drop_last_partial_validation_sequence", True)
        self.blend = None
        self.blend_per_split = None
        self.mock = case.get("mock", False)
        self.split = case.get("split")
        self.split_matrix = None
        if case.get("blend"):
            self.blend = (case["blend"]["prefixes"], case["blend"]["weights"])
        if case.get("blend_per_split"):
            self.blend_per_split = [None if b is None else (b["prefixes"], b["weights"])
                                    for b in case["blend_per_split"]]
            self.split = None
        else:
            if self.blend is None:
                self.mock = True
                self.split = "1,1,1"
            self.split_matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(self.split))


# ---- GPTDataset (gpt_dataset.py) ----------------------------------------------------------

def build_sample_idx_loop(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch,
                          drop_last_partial_sequence=True, add_extra_token=1):
    """helpers.cpp build_sample_idx, statement by statement."""
    if drop_last_partial_sequence:
        num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_length
    else:
        num_samples = int(math.ceil(numpy.float32(num_epochs * tokens_per_epoch - add_extra_token)
                                    / numpy.float32(seq_length)))
    sample_idx = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    document_idx_index = 0
    doc_offset = 0
    sample_idx_index = 1
    while sample_idx_index <= num_samples:
        remaining = seq_length + add_extra_token
        while remaining != 0:
            document_length = int(sizes[document_idx[document_idx_index]]) - doc_offset
            remaining -= document_length
            if remaining <= 0:
                doc_offset += remaining + document_length - add_extra_token
                remaining = 0
            else:
                if document_idx_index == len(document_idx) - 1:
                    assert sample_idx_index == num_samples
                    doc_offset = int(sizes[document_idx[document_idx_index]]) - add_extra_token
                    break
                document_idx_index += 1
                doc_offset = 0
        sample_idx[sample_idx_index] = (document_idx_index, doc_offset)
        sample_idx_index += 1
    return sample_idx


def build_sample_idx_vectorized(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch):
    """The same rows by another route (drop_last only): sample k starts at flat token k * seq_length,
    in the document whose tokens contain it."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    lengths = sizes[document_idx].astype(numpy.int64)
    ends = numpy.cumsum(lengths)
    starts = ends - lengths
    t = numpy.arange(num_samples + 1, dtype=numpy.int64) * seq_length
    pos = numpy.searchsorted(ends, t, side="right")
    out = numpy.stack([pos, t - starts[pos]], axis=1)
    return out


def build_sample_idx(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch, drop_last):
    """helpers.build_sample_idx: int32 unless the values may not fit."""
    if drop_last and num_epochs * tokens_per_epoch // seq_length > 20000:
        rows = build_sample_idx_vectorized(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch)
    else:
        rows = build_sample_idx_loop(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch, drop_last)
    if max(document_idx.shape[0], sizes.max()) <= numpy.iinfo(numpy.int32).max:
        return rows.astype(numpy.int32)
    return rows


def _build_document_index(documents, num_epochs, numpy_random_state, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        document_index = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        document_index[:] = documents
        document_index = document_index.reshape(-1)
        document_index = document_index.astype(numpy.int32)
        numpy_random_state.shuffle(document_index)
        return document_index
    doc_idx_first = _build_document_index(documents, num_epochs - 1, numpy_random_state, False)
    doc_idx_last = _build_document_index(documents, 1, numpy_random_state, False)
    return numpy.concatenate((doc_idx_first, doc_idx_last))


def _build_shuffle_index(num_samples, total_size, numpy_random_state):
    dtype_ = numpy.uint32
    if total_size >= (numpy.iinfo(numpy.uint32).max - 1):
        dtype_ = numpy.int64
    shuffle_idx_first = numpy.arange(start=0, stop=num_samples, step=1, dtype=dtype_)
    numpy_random_state.shuffle(shuffle_idx_first)
    if num_samples == total_size:
        return shuffle_idx_first
    shuffle_idx_last = numpy.arange(start=num_samples, stop=total_size, step=1, dtype=dtype_)
    numpy_random_state.shuffle(shuffle_idx_last)
    return numpy.concatenate((shuffle_idx_first, shuffle_idx_last))


class GPTDataset:
    def __init__(self, dataset, dataset_path, indices, num_samples, index_split, config, cls="GPTDataset"):
        self.dataset = dataset
        self.indices = indices
        self.num_samples = num_samples
        self.index_split = index_split
        self.config = config
        self.cls = cls
        ids = OrderedDict()
        ids["class"] = cls
        ids["dataset_path"] = dataset_path
        ids["num_samples"] = num_samples
        ids["index_split"] = index_split
        ids["random_seed"] = config.random_seed
        ids["sequence_length"] = config.sequence_length
        ids["split"] = config.split
        ids["split_matrix"] = config.split_matrix
        ids["tokenizer"] = config.tokenizer
        self.unique_identifiers = ids
        self.unique_description = json.dumps(ids, indent=4, default=lambda obj: obj.unique_identifiers)
        self.unique_description_hash = hashlib.md5(self.unique_description.encode("utf-8")).hexdigest()
        self.base = f"{self.unique_description_hash}-{cls}-{index_split}"
        self.cache_dir = config.path_to_cache
        if self.cache_dir is None and not config.mock:
            self.cache_dir = os.path.join(dataset.path_prefix, "cache", f"{cls}_indices")
        self.build()

    def build(self):
        seq = self.config.sequence_length
        tpe = int(numpy.sum(self.dataset.sequence_lengths[self.indices]))
        num_epochs = 1
        if self.num_samples is not None:
            tokens = tpe
            while tokens < self.num_samples * seq + 1:
                num_epochs += 1
                tokens += tpe
        separate = False
        if num_epochs > 1:
            sans = ((num_epochs - 1) * tpe - 1) // seq
            final = self.num_samples - sans
            per = (tpe - 1) // seq
            assert 0 <= final <= per + 1
            separate = final < int(0.80 * per)
        self.num_epochs, self.separate_final_epoch = num_epochs, separate
        rs = numpy.random.RandomState(self.config.random_seed)
        self.document_index = _build_document_index(self.indices, num_epochs, rs, separate)
        drop_last = True
        if self.index_split == "valid":
            drop_last = self.config.drop_last_partial_validation_sequence
        self.sample_index = build_sample_idx(self.dataset.sequence_lengths, self.document_index, seq,
                                             num_epochs, tpe, drop_last)
        total = self.sample_index.shape[0] - 1
        if separate:
            self.shuffle_index = _build_shuffle_index(sans, total, rs)
        else:
            self.shuffle_index = _build_shuffle_index(total, total, rs)

    def __len__(self):
        return self.sample_index.shape[0] - 1

    def __getitem__(self, idx):
        seq = self.config.sequence_length
        idx = self.shuffle_index[idx]
        b, bo = self.sample_index[idx]
        e, eo = self.sample_index[idx + 1]
        parts = []
        if b == e:
            parts.append(self.dataset.get(self.document_index[b], offset=bo, length=eo - bo + 1))
        else:
            for i in range(b, e + 1):
                offset = 0 if i > b else bo
                length = None if i < e else eo + 1
                parts.append(self.dataset.get(self.document_index[i], offset=offset, length=length))
        n = sum(map(len, parts))
        if n < seq + 1:
            parts.append([-1] * (seq + 1 - n))
        return numpy.concatenate(parts, dtype=numpy.int64)

    def arrays(self):
        return OrderedDict([("document_index", self.document_index), ("sample_index", self.sample_index),
                            ("shuffle_index", self.shuffle_index)])


# ---- BlendedDataset (blended_dataset.py, helpers.cpp) -------------------------------------

def build_blending_indices(weights, size):
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
    current = [0] * len(weights)
    for i in range(size):
        s = max(float(i), 1.0)
        best, best_error = 0, weights[0] * s - float(current[0])
        for d in range(1, len(weights)):
            error = weights[d] * s - float(current[d])
            if error > best_error:
                best, best_error = d, error
        dataset_index[i] = best
        dataset_sample_index[i] = current[best]
        current[best] += 1
    return dataset_index, dataset_sample_index


def build_exhaustive_blending_indices(sizes):
    total = sum(sizes)
    weights = [s / float(total) for s in sizes]
    counts = [0] * len(sizes)
    unspent = sorted(range(len(sizes)))
    dataset_index = numpy.zeros(total, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(total, dtype=numpy.int64)
    i = 0
    while unspent:
        s = max(float(i), 1.0)
        best, best_error = -1, -sys.float_info.max
        for d in unspent:
            error = weights[d] * s - float(counts[d])
            if error > best_error:
                best, best_error = d, error
        dataset_index[i] = best
        dataset_sample_index[i] = counts[best]
        counts[best] += 1
        if sizes[best] - float(counts[best]) == 0:
            unspent.remove(best)
        i += 1
    return dataset_index, dataset_sample_index


class BlendedDataset:
    def __init__(self, datasets, weights, size, config):
        assert all(w > 0 for w in weights)
        if size is not None:
            weights = normalize(weights)
        self.datasets = datasets
        self.split = datasets[0].index_split
        ids = OrderedDict()
        ids["class"] = "BlendedDataset"
        ids["datasets"] = [d.unique_identifiers for d in datasets]
        ids["split"] = self.split
        ids["weights"] = weights
        ids["size"] = size
        self.unique_description = json.dumps(ids, indent=4, default=lambda obj: obj.unique_identifiers)
        self.unique_description_hash = hashlib.md5(self.unique_description.encode("utf-8")).hexdigest()
        self.base = f"{self.unique_description_hash}-BlendedDataset-{self.split}"
        self.cache_dir = config.path_to_cache
        if size is not None:
            self.dataset_index, self.dataset_sample_index = build_blending_indices(weights, size)
        else:
            self.dataset_index, self.dataset_sample_index = build_exhaustive_blending_indices(weights)
        counts = numpy.bincount(self.dataset_index, minlength=len(datasets))
        for d, c in zip(datasets, counts):
            assert c <= len(d), "blend oversamples"

    def __len__(self):
        return self.dataset_index.shape[0]

    def __getitem__(self, idx):
        return self.datasets[self.dataset_index[idx]][self.dataset_sample_index[idx]]

    def arrays(self):
        return OrderedDict([("dataset_index", self.dataset_index),
                            ("dataset_sample_index", self.dataset_sample_index)])


# ---- the builder (blended_megatron_dataset_builder.py) -------------------------------------

def sizes_per_split_per_dataset(weights, sizes):
    return [[int(math.ceil(t * w * 1.005)) for t in sizes] for w in weights]


def build_megatron_dataset_splits(prefix, split, sizes, config, cls="GPTDataset"):
    low = MockLowLevelDataset(config.eod) if config.mock else IndexedDataset(prefix)
    n = len(low)
    out = []
    for i, name in enumerate(SPLITS):
        if split[i] is None:
            out.append(None)
            continue
        beg = int(round(split[i][0] * float(n)))
        end = int(round(split[i][1] * float(n)))
        indices = numpy.arange(start=beg, stop=end, step=1, dtype=numpy.int32)
        out.append(GPTDataset(low, prefix, indices, sizes[i], name, config, cls))
    return out


def blend_top(mids, weights, per_dataset, size, i, config):
    if weights is not None and size is not None:
        size_per_dataset = [p[i] for p in per_dataset]
        total = sum(size_per_dataset)
        w = weights
        if config.renormalize_blend_weights:
            w = [s / total for s in size_per_dataset]
        return BlendedDataset(mids, w, total, config)
    lens = [len(m) for m in mids]
    return BlendedDataset(mids, lens, None if size is None else min(size, sum(lens)), config)


def build(config, sizes):
    if config.mock:
        return build_megatron_dataset_splits(None, config.split_matrix, sizes, config, "MockGPTDataset")
    if config.blend is not None:
        prefixes, weights = config.blend
        if weights is not None:
            weights = normalize(weights)
        split = config.split_matrix
        if len(prefixes) == 1 and weights is None:
            return build_megatron_dataset_splits(prefixes[0], split, sizes, config)
        if weights is None:
            per_dataset = [[None] * 3 for _ in prefixes]
        else:
            per_dataset = sizes_per_split_per_dataset(weights, sizes)
        mids = [build_megatron_dataset_splits(p, split, per_dataset[j], config) for j, p in enumerate(prefixes)]
        out = []
        for i in range(3):
            out.append(None if split[i] is None else
                       blend_top([m[i] for m in mids], weights, per_dataset, sizes[i], i, config))
        return out
    out = [None] * 3
    for i in range(3):
        blend = config.blend_per_split[i]
        if blend is None:
            continue
        spoof = [None] * 3
        spoof[i] = (0.0, 1.0)
        sizes_spoof = [0] * 3
        sizes_spoof[i] = sizes[i]
        prefixes, weights = blend
        if weights is not None:
            weights = normalize(weights)
        if len(prefixes) == 1:
            out[i] = build_megatron_dataset_splits(prefixes[0], spoof, sizes_spoof, config)[i]
            continue
        if weights is None:
            per_dataset = [[None] * 3 for _ in prefixes]
        else:
            per_dataset = sizes_per_split_per_dataset(weights, sizes_spoof)
        mids = [build_megatron_dataset_splits(p, spoof, per_dataset[j], config)[i] for j, p in enumerate(prefixes)]
        out[i] = blend_top(mids, weights, per_dataset, sizes[i], i, config)
    return out


# ---- checks --------------------------------------------------------------------------------

class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, what):
        if not ok:
            self.items.append(what)
        return ok


def npy_bytes(array):
    b = io.BytesIO()
    numpy.save(b, array, allow_pickle=True)
    return b.getvalue()


def check_cached(ds, fails, label):
    """The files tessera wrote for `ds` under the names Megatron would use."""
    if ds.cache_dir is None:
        return
    desc_path = os.path.join(ds.cache_dir, ds.base + "-description.txt")
    if not fails.check(os.path.isfile(desc_path), f"{label}: missing {desc_path}"):
        return
    with open(desc_path, encoding="utf-8") as f:
        fails.check(f.read() == ds.unique_description, f"{label}: description.txt differs")
    for name, expected in ds.arrays().items():
        path = os.path.join(ds.cache_dir, f"{ds.base}-{name}.npy")
        if not fails.check(os.path.isfile(path), f"{label}: missing {path}"):
            continue
        got = numpy.load(path, allow_pickle=True, mmap_mode="r")
        ok = (got.dtype == expected.dtype and got.shape == expected.shape and numpy.array_equal(got, expected))
        if not fails.check(ok, f"{label}: {name} differs: tessera {got.dtype}{got.shape}, reference "
                               f"{expected.dtype}{expected.shape}"):
            if got.shape == expected.shape:
                bad = numpy.nonzero(numpy.asarray(got) != expected)
                print(f"  first differences of {name} at {[b[:5].tolist() for b in bad]}", file=sys.stderr)
            continue
        with open(path, "rb") as f:
            fails.check(f.read() == npy_bytes(expected), f"{label}: {name}.npy bytes differ from numpy.save's")


def check_case(case, fails):
    config = Config(case)
    sizes = case["sizes"]
    built = build(config, sizes)
    report = []
    for i, name in enumerate(SPLITS):
        ours = built[i]
        theirs = case["outputs"][i]
        label = f"{case['name']}/{name}"
        if ours is None or theirs is None:
            fails.check(ours is None and theirs is None, f"{label}: present on one side only")
            continue
        fails.check(theirs["base"] == ours.base, f"{label}: base {theirs['base']} != reference {ours.base}")
        fails.check(theirs["size"] == len(ours), f"{label}: len {theirs['size']} != reference {len(ours)}")
        check_cached(ours, fails, label)
        if isinstance(ours, BlendedDataset):
            comps = theirs.get("components", [])
            fails.check(len(comps) == len(ours.datasets), f"{label}: component count")
            for j, (c, d) in enumerate(zip(comps, ours.datasets)):
                fails.check(c["base"] == d.base, f"{label}/component {j}: base {c['base']} != {d.base}")
                check_cached(d, fails, f"{label}/component {j}")
                report.append(f"{label}/{j}: epochs={d.num_epochs} separate={d.separate_final_epoch}")
        else:
            report.append(f"{label}: epochs={ours.num_epochs} separate={ours.separate_final_epoch}")
        samples = numpy.load(theirs["samples"])
        for row, idx in enumerate(theirs["sample_ids"]):
            expected = ours[idx]
            if not fails.check(numpy.array_equal(samples[row].astype(numpy.int64), expected),
                               f"{label}: sample {idx} differs"):
                print(f"  tessera   {samples[row][:16].tolist()}\n  reference {expected[:16].tolist()}",
                      file=sys.stderr)
                break
    print(f"{case['name']}: " + "; ".join(report))


def self_check(fails):
    """build_sample_idx: the literal port and the vectorised route agree."""
    rs = numpy.random.RandomState(5)
    for trial in range(40):
        sizes = rs.randint(0, 40, size=rs.randint(2, 60)).astype(numpy.int32)
        sizes[rs.randint(len(sizes))] += 2
        docs = numpy.arange(len(sizes), dtype=numpy.int32)
        seq = int(rs.randint(2, 20))
        epochs = int(rs.randint(1, 4))
        tpe = int(sizes.sum())
        doc_index = numpy.tile(docs, epochs)
        rs.shuffle(doc_index)
        a = build_sample_idx_loop(sizes, doc_index, seq, epochs, tpe)
        b = build_sample_idx_vectorized(sizes, doc_index, seq, epochs, tpe)
        fails.check(numpy.array_equal(a, b), f"self-check {trial}: loop and vectorised sample index differ")


def check_rng(directory, fails):
    with open(os.path.join(directory, "rng.json")) as f:
        spec = json.load(f)
    for seed in spec["seeds"]:
        rs = numpy.random.RandomState(seed)
        got = numpy.load(os.path.join(directory, f"mt_{seed}_u32.npy"))
        want = numpy.array([rs.randint(0, 2**32, dtype=numpy.uint64) for _ in range(len(got))], dtype=numpy.uint32)
        fails.check(numpy.array_equal(got, want), f"MT19937 seed {seed}: 32-bit outputs differ")
        got = numpy.load(os.path.join(directory, f"mt_{seed}_double.npy")).view(numpy.float64)
        want = rs.random_sample(len(got))
        fails.check(got.tobytes() == want.tobytes(), f"MT19937 seed {seed}: random_sample differs")
        for n in spec["shuffle_sizes"]:
            got = numpy.load(os.path.join(directory, f"mt_{seed}_shuffle_{n}.npy"))
            want = numpy.arange(n, dtype=got.dtype)
            rs.shuffle(want)
            fails.check(numpy.array_equal(got, want), f"MT19937 seed {seed}: shuffle of {n} differs")
        got = numpy.load(os.path.join(directory, f"mt_{seed}_permutation.npy"))
        fails.check(numpy.array_equal(got, rs.permutation(len(got))), f"MT19937 seed {seed}: permutation differs")
    for seed in spec["pcg_seeds"]:
        got = numpy.load(os.path.join(directory, f"pcg_{seed}.npy"))
        lo, hi = spec["pcg_range"]
        want = numpy.random.default_rng(seed).integers(lo, hi, size=len(got), dtype=numpy.int32)
        fails.check(numpy.array_equal(got, want), f"PCG64 seed {seed}: integers differ")
    for case in spec.get("float_repr", []):
        fails.check(repr(case["value"]) == case["repr"], f"float repr of {case['value']!r}: tessera {case['repr']}")
    for case in spec.get("sums", []):
        fails.check(float(numpy.sum(numpy.array(case["values"], dtype=numpy.float64))) == case["sum"],
                    f"numpy.sum of {len(case['values'])} values differs")
    for case in spec.get("json", []):
        obj = json.loads(case["json"], object_pairs_hook=OrderedDict)
        fails.check(json.dumps(obj, indent=4) == case["dumps"], f"json.dumps differs for {case['json'][:60]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest")
    ap.add_argument("--rng")
    args = ap.parse_args()
    fails = Failures()
    if args.rng:
        check_rng(args.rng, fails)
    if args.manifest:
        self_check(fails)
        with open(args.manifest) as f:
            manifest = json.load(f)
        for case in manifest["cases"]:
            check_case(case, fails)
    for f in fails.items:
        print("FAIL:", f, file=sys.stderr)
    print("gpt_dataset_reference: " + ("OK" if not fails.items else f"{len(fails.items)} failures"))
    return 1 if fails.items else 0


if __name__ == "__main__":
    sys.exit(main())
