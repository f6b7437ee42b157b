"""A delta over its keyframe decoded in one pass (codec.decode_on_keyframe): the checkout's most
common chain, a fine-tune over the version it started from. The same bytes as decoding the
keyframe and then the delta, for every shape it takes; None for the shapes it does not; every
damaged input refused; and the store's checkout takes this path."""

import random
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from wvc import Repo, codec
from wvc.codec import native, transforms
from wvc.codec.container import ROTATED, Method, peek
from wvc.errors import CorruptObject
from wvc.formats.dtypes import DTYPES
from wvc.store import chunks
from wvc.store.packs import pack_filename

from .test_codec import related_pair
from .test_whole_payloads import weights_pair

pytestmark = pytest.mark.skipif(not native.whole_payloads, reason="needs the C kernels' whole payloads")


def keyframe_and_delta(new: bytes, base: bytes, dtype) -> tuple[bytes, bytes]:
    keyframe = codec.encode(base, dtype, method=Method.PLANES).payload
    delta = codec.encode(new, dtype, base, method=Method.ULP_EXP).payload
    return keyframe, delta


def two_decodes(delta: bytes, keyframe: bytes, size: int) -> bytes:
    return codec.decode(delta, size, codec.decode(keyframe, size))


@settings(max_examples=60, deadline=None)
@given(name=hs.sampled_from(["BF16", "F32"]), n=hs.integers(1, 60_000), seed=hs.integers(0, 2**32 - 1),
       lr=hs.sampled_from([1e-6, 1e-4, 1e-2, 1.0]), weights=hs.booleans())
def test_one_pass_gives_the_bytes_of_the_two_decodes(name, n, seed, lr, weights):
    """Weights over many exponents with optimizer-like steps, and random bit patterns (every
    sign, NaNs, infinities, subnormals): the chunk itself, byte for byte."""
    dtype = DTYPES[name]
    if weights:
        new, base = weights_pair(n, seed, dtype=torch.bfloat16 if name == "BF16" else torch.float32, lr=lr)
    else:
        new, base = related_pair(n * dtype.width, min(lr, 0.3), seed=seed)
    keyframe, delta = keyframe_and_delta(new, base, dtype)
    assert peek(keyframe).param == ROTATED and peek(delta).param == 8 * dtype.width - 9
    assert codec.decode_on_keyframe(delta, keyframe, len(new)) == new == two_decodes(delta, keyframe, len(new))


def test_other_shapes_are_left_to_the_two_decodes():
    """float16's exponent is not the rotated keyframe's top byte; SPARSE and XOR deltas are not
    grouped; a keyframe of another size was fitted to the chunk; an unrotated keyframe
    (integers) has no exponent plane: None, and the caller decodes link by link."""
    new, base = weights_pair(20_000, seed=3)
    bf16 = DTYPES["BF16"]
    keyframe, delta = keyframe_and_delta(new, base, bf16)
    for other in (Method.SPARSE, Method.XOR):
        assert codec.decode_on_keyframe(codec.encode(new, bf16, base, method=other).payload, keyframe,
                                        len(new)) is None
    shorter = codec.encode(base[:-2], bf16, method=Method.PLANES).payload
    assert codec.decode_on_keyframe(delta, shorter, len(new)) is None
    f16_new, f16_base = weights_pair(20_000, seed=3, dtype=torch.float16)
    f16 = DTYPES["F16"]
    f16_key, f16_delta = keyframe_and_delta(f16_new, f16_base, f16)
    assert codec.decode_on_keyframe(f16_delta, f16_key, len(f16_new)) is None
    i16 = DTYPES["I16"]
    int_key = codec.encode(base, i16, method=Method.PLANES).payload
    assert peek(int_key).param != ROTATED
    assert codec.decode_on_keyframe(delta, int_key, len(new)) is None
    assert codec.decode_on_keyframe(delta, keyframe, len(new) + 2) is None


def test_damaged_inputs_are_refused_never_a_crash():
    """Mutated and truncated deltas and keyframes, straight into the C function (which must
    not trust the caller's peek): ValueError, or a chunk of exactly the declared size (whether
    its bytes are right is the store's hash check's job). The same loop ran 20,000 mutations
    under AddressSanitizer and UBSan when this was written."""
    rng = random.Random(8)
    cases = []
    for name, torch_dtype in (("BF16", torch.bfloat16), ("F32", torch.float32)):
        dtype = DTYPES[name]
        new, base = weights_pair(3000, seed=len(cases), dtype=torch_dtype)
        cases.append((*keyframe_and_delta(new, base, dtype), dtype))
    kernels = native.kernels
    for _ in range(3000):
        keyframe, delta, dtype = rng.choice(cases)
        parts = [bytearray(keyframe), bytearray(delta)]
        victim = parts[rng.randrange(2)]
        for _ in range(rng.randrange(1, 4)):
            victim[rng.randrange(len(victim))] = rng.randrange(256)
        if rng.random() < 0.2:
            del victim[rng.randrange(len(victim) + 1):]
        width = rng.choice([dtype.width, 2, 4, 8, 1])
        shift = rng.choice([width * 8 - 9, dtype.exponent[0], 3])
        try:
            out = kernels.decode_on_keyframe(bytes(parts[1]), bytes(parts[0]), width, rng.randrange(0, 5), shift,
                                             rng.choice([1, 16384]))
        except ValueError:
            continue
        assert len(out) == struct.unpack_from("<Q", parts[1], 4)[0]
    keyframe, delta, dtype = cases[0]
    with pytest.raises(CorruptObject):
        transforms.decode_on_keyframe(delta[:-1], keyframe, struct.unpack_from("<Q", delta, 4)[0])


def test_the_store_names_the_methods_the_codec_writes():
    """store/chunks.py reads these from the objects table without importing the codec."""
    assert (chunks._PLANES, chunks._ULP_EXP) == (int(Method.PLANES), int(Method.ULP_EXP))
    assert set(chunks._STEP_CODERS) == {int(m) for m in Method if m.uses_context}


def _fine_tune(tmp_path):
    """A repository with a bf16 model and a dense step of it, and the step's bytes."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    start = {f"layer{i}.weight": (torch.randn(256, 512, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}
    step = {k: (v.float() + torch.randn(v.shape, generator=g) * 1e-3).to(torch.bfloat16) for k, v in start.items()}
    model = tmp_path / "model"
    model.mkdir()
    repo = Repo.init(model)
    save_file(start, str(model / "model.safetensors"))
    repo.commit("start")
    save_file(step, str(model / "model.safetensors"))
    commit = repo.commit("step").commit
    return repo, commit, (model / "model.safetensors").read_bytes()


def test_a_checkout_of_a_fine_tune_decodes_each_chunk_in_one_pass(tmp_path, monkeypatch):
    """Every delta chunk of a dense step over its start: one decode_on_keyframe call, no
    link-by-link decode; the file byte-identical."""
    repo, commit, expected = _fine_tune(tmp_path)
    calls = {"pair": 0, "link": 0}
    pair, link = codec.decode_on_keyframe, transforms.decode_chunk

    def counted_pair(*args):
        calls["pair"] += 1
        return pair(*args)

    def counted_link(*args, **kwargs):
        calls["link"] += 1
        return link(*args, **kwargs)

    monkeypatch.setattr(codec, "decode_on_keyframe", counted_pair)
    monkeypatch.setattr(transforms, "decode_chunk", counted_link)
    out = tmp_path / "out"
    repo.checkout(commit, output=out, force=True)
    assert (out / "model.safetensors").read_bytes() == expected
    assert calls["pair"] >= 3  # a chunk a tensor at least
    assert calls["link"] <= 2  # the header and its base (bytes, not a delta over a keyframe)


def test_a_damaged_delta_is_named_as_before(tmp_path):
    """When the one pass fails (here: a flipped byte in a delta's stream), the link-by-link
    decode runs again, every link checked, and names the object at fault."""
    repo, commit, _ = _fine_tune(tmp_path)
    store = repo.internals.store
    row = next(r for r in (store.chain(oid) for (oid,) in store.db.query("SELECT id FROM objects WHERE depth = 1"))
               if r[0].method == int(Method.ULP_EXP))[0]
    pack = store.reader.directory / pack_filename(row.pack)
    data = bytearray(pack.read_bytes())
    data[row.offset + row.length - 5] ^= 0x40
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    with pytest.raises(CorruptObject, match=row.id[:8]):
        store.get(row.id)


def test_a_longer_chain_decodes_its_bottom_pair_in_one_pass(tmp_path, monkeypatch):
    """Three versions: the newest is a delta over a delta over the keyframe. Its checkout
    decodes the keyframe and the first delta in one pass, then the last delta over that;
    the file byte-identical. (A step-coded link above the pair needs the keyframe's bytes as
    its context: that chain is decoded link by link, which the suite's step tests cover.)"""
    from safetensors.torch import save_file

    repo, _, _ = _fine_tune(tmp_path)
    model = repo.root
    g = torch.Generator().manual_seed(9)
    from safetensors.torch import load_file

    step = {k: (v.float() + torch.randn(v.shape, generator=g) * 1e-3).to(torch.bfloat16)
            for k, v in load_file(str(model / "model.safetensors")).items()}
    save_file(step, str(model / "model.safetensors"))
    third = repo.commit("third").commit
    expected = (model / "model.safetensors").read_bytes()
    store = repo.internals.store
    depths = [d for (d,) in store.db.query("SELECT depth FROM objects")]
    assert max(depths) == 2
    pairs = []
    real = codec.decode_on_keyframe
    monkeypatch.setattr(codec, "decode_on_keyframe", lambda *a: pairs.append(1) or real(*a))
    out = tmp_path / "out3"
    repo.checkout(third, output=out, force=True)
    assert (out / "model.safetensors").read_bytes() == expected
    assert len(pairs) >= 3
