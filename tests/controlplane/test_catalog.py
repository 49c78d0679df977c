"""The shipped catalog loads, its derived sizes follow from the architecture, and bad files fail in one line."""

import pytest

from controlplane.catalog import Catalog, CatalogError, UnknownModelError
from edgepop.cli import main

REQUIRED_IDS = ["@cf/meta/llama-3.1-8b-instruct", "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
                "@cf/mistral/mistral-7b-instruct-v0.1", "@cf/baai/bge-base-en-v1.5", "@cf/baai/bge-reranker-base",
                "@cf/huggingface/distilbert-sst-2-int8", "@cf/microsoft/resnet-50", "@cf/openai/whisper"]


def test_shipped_catalog_has_the_workers_ai_models(catalog):
    for mid in REQUIRED_IDS:
        assert mid in catalog
    assert len(catalog) >= 20


def test_derived_sizes_follow_the_architecture(catalog):
    llama = catalog["@cf/meta/llama-3.1-8b-instruct"]
    # 2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB per token
    assert llama.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert llama.weight_bytes == pytest.approx(8.03e9 * 2)
    big = catalog["@cf/meta/llama-3.3-70b-instruct-fp8-fast"]
    assert big.weight_bytes == pytest.approx(70.6e9)  # fp8: one byte per parameter
    assert big.bytes_per_gpu == pytest.approx(big.replica_bytes / 2)
    assert catalog["@cf/baai/bge-base-en-v1.5"].kv_bytes_per_token == 0


def test_every_stand_in_is_an_executable_data_plane_model(catalog):
    from dataplane import registry

    known = {c.name for c in registry.list_models()}
    for spec in catalog:
        assert spec.stand_in in known, spec.id
        assert registry.get_card(spec.stand_in).task == spec.task, spec.id


def test_edgepop_entries_match_the_data_plane_presets(catalog):
    from dataplane.models import bert, gpt2

    for name, preset in (("@edgepop/gpt2-tiny", gpt2.PRESETS["tiny"]), ("@edgepop/gpt2-small", gpt2.PRESETS["small"])):
        spec = catalog[name]
        assert (spec.layers, spec.hidden, spec.heads, spec.vocab, spec.context_window) == (
            preset.n_layer, preset.n_embd, preset.n_head, preset.vocab_size, preset.n_ctx)
    small = bert.PRESETS["small"]
    spec = catalog["@edgepop/all-minilm-l6-v2"]
    assert (spec.layers, spec.hidden, spec.heads, spec.intermediate) == (
        small.n_layer, small.hidden, small.n_head, small.intermediate)


def test_unknown_model_is_code_5007(catalog):
    with pytest.raises(UnknownModelError) as err:
        catalog["@cf/nope/model"]
    assert err.value.code == 5007 and "@cf/nope/model" in str(err.value)


GOOD = """
[models."@cf/x/y"]
task = "text-embeddings"
family = "bert"
parameters = 1e8
precision = "fp16"
context_window = 512
layers = 12
hidden = 768
heads = 12
neurons_per_m_input = 100
stand_in = "minilm-l6-v2"
"""


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.replace('precision = "fp16"', 'precision = "fp7"'), "'precision'"),
    (lambda s: s.replace("layers = 12", "layers = -1"), "'layers'"),
    (lambda s: s.replace("layers = 12", "layerz = 12"), "'layerz'"),
    (lambda s: s.replace('task = "text-embeddings"', 'task = "dance"'), "'task'"),
    (lambda s: s.replace("hidden = 768\n", ""), "'hidden'"),
    (lambda s: s.replace('"@cf/x/y"', '"no-at-sign"'), "no-at-sign"),
    (lambda s: s + "\n[models", "not valid TOML"),
    (lambda s: s.replace('task = "text-embeddings"', 'task = "text-generation"'), "required"),
    # an image model must count images and say what one costs (0 GFLOPs: every size took the same time)
    (lambda s: s.replace('task = "text-embeddings"', 'task = "image-classification"'),
     "'unit': 'token' does not fit task 'image-classification', which counts images"),
    (lambda s: s.replace('task = "text-embeddings"', 'task = "image-classification"\nunit = "image"'),
     "'gflops_per_unit': required"),
    (lambda s: s + 'unit = "audio-minute"\n', "'unit': 'audio-minute' does not fit task 'text-embeddings'"),
    # each GPU of a tensor-parallel replica holds whole heads (it failed later, in estimate or placement, unnamed)
    (lambda s: s + "tensor_parallel = 5\n", "'tensor_parallel': 5 does not divide the model's 12 attention heads"),
])
def test_bad_catalog_entries_fail_with_one_line_naming_the_field(tmp_path, edit, needle):
    path = tmp_path / "cat.toml"
    path.write_text(edit(GOOD))
    with pytest.raises(CatalogError) as err:
        Catalog.load(path)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and "cat.toml" in msg


def test_good_custom_catalog_loads(tmp_path):
    path = tmp_path / "cat.toml"
    path.write_text(GOOD)
    cat = Catalog.load(path)
    assert cat.ids == ["@cf/x/y"] and cat["@cf/x/y"].head_dim == 64


def test_missing_catalog_file(tmp_path):
    with pytest.raises(CatalogError, match="not found"):
        Catalog.load(tmp_path / "none.toml")


def test_catalog_frame(catalog):
    frame = catalog.to_frame()
    assert len(frame) == len(catalog) and (frame.replica_gb > 0).all()


def test_cli_exit_code_for_user_errors_is_2(capsys):
    # any sub-command's UserError reaches the dispatcher as one line
    assert main(["topology", "--pops", "/nonexistent.csv"]) == 2
    assert "edgepop: error:" in capsys.readouterr().err


def test_the_real_minilms_window_is_its_checkpoints(catalog):
    """The catalog said 512; the checkpoint reads 256 tokens (longer texts were cut without a word)."""
    from dataplane.models import minilm

    assert catalog["@edgepop/all-minilm-l6-v2"].context_window == minilm.max_seq_length(minilm.model_dir())


def test_xlm_roberta_encoders_have_a_plain_mlp(catalog):
    # bge-m3 and bge-reranker-base are XLM-RoBERTa: BERT's 2-matrix MLP (a gate made their body a third bigger)
    from controlplane.perf_arch import body_params, gated_mlp

    m3, large = catalog["@cf/baai/bge-m3"], catalog["@cf/baai/bge-large-en-v1.5"]
    assert m3.family == "xlm-roberta" and not gated_mlp(m3) and not gated_mlp(catalog["@cf/baai/bge-reranker-base"])
    assert body_params(m3) == pytest.approx(body_params(large))  # same body shape (24 x 1024, 4096 MLP)


GOOD_LLM = """
[models."@cf/x/chat"]
task = "text-generation"
family = "llama"
parameters = 1e9
precision = "bf16"
context_window = 8192
layers = 16
hidden = 2048
heads = 32
kv_heads = 8
intermediate = 8192
vocab = 32000
neurons_per_m_input = 1
neurons_per_m_output = 1
kv_pool_tokens = 8192
stand_in = "gpt2-tiny"
"""


def _load_error(tmp_path, text: str) -> str:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as err:
        Catalog.load(path)
    msg = str(err.value)
    assert "\n" not in msg and "mine.toml" in msg and "'@cf/x/chat'" in msg
    return msg


def test_a_kv_pool_below_the_context_window_is_refused(tmp_path, catalog):
    # A prompt the window allows but the pool cannot hold was refused (3006) by every replica of the model.
    msg = _load_error(tmp_path, GOOD_LLM.replace("kv_pool_tokens = 8192", "kv_pool_tokens = 4096"))
    assert "'kv_pool_tokens': 4096 is below the context window 8192" in msg
    for spec in catalog.by_task("text-generation"):
        assert spec.kv_pool_tokens >= spec.kv_charge(spec.context_window), spec.id  # (a sliding window's: less)


def test_an_unknown_family_must_say_which_mlp_it_has(tmp_path):
    from controlplane.perf_arch import body_params, gated_mlp

    msg = _load_error(tmp_path, GOOD_LLM.replace('family = "llama"', 'family = "lama"'))
    assert "'family': 'lama' is not a known family (bert, " in msg and "llama" in msg and "mlp = " in msg
    msg = _load_error(tmp_path, GOOD_LLM.replace('family = "llama"', 'family = "phi"\nmlp = "swiglu"'))
    assert "'mlp': 'swiglu' is not one of gated, plain" in msg
    path = tmp_path / "ok.toml"
    specs = {}
    for kind in ("gated", "plain"):
        path.write_text(GOOD_LLM.replace('family = "llama"', f'family = "phi"\nmlp = "{kind}"'))
        specs[kind] = Catalog.load(path)["@cf/x/chat"]
    assert gated_mlp(specs["gated"]) and not gated_mlp(specs["plain"])
    assert body_params(specs["gated"]) - body_params(specs["plain"]) == 16 * 2048 * 8192  # the gate matrices
    # Without heads and intermediate nothing counts the MLP: an unknown family needs no mlp.
    path.write_text(GOOD.replace('family = "bert"', 'family = "vit"').replace("heads = 12\n", ""))
    assert Catalog.load(path)["@cf/x/y"].mlp == ""


# The rule before the catalog said each entry's MLP kind: these families plain, every other one gated.
FORMER_PLAIN = {"gpt2", "gptj", "falcon", "bloom", "opt", "bert", "roberta", "xlm-roberta"}


def test_shipped_and_reference_entries_keep_the_mlp_they_were_counted_with(catalog):
    from controlplane.perf_arch import gated_mlp
    from controlplane.perf_rows import REFERENCE_MODELS

    counted = [s for cat in (catalog, Catalog.load(REFERENCE_MODELS)) for s in cat
               if s.unit == "token" and s.heads and s.intermediate]
    assert len(counted) > 20
    for spec in counted:
        assert gated_mlp(spec) == (spec.family not in FORMER_PLAIN), spec.id


# (encoder layers, decoder layers, n_mels) from each model's config.json; the rest is in the catalog entry.
WHISPER = {"@cf/openai/whisper": (12, 12, 80), "@cf/openai/whisper-large-v3-turbo": (32, 4, 128)}


def whisper_gflops_per_minute(spec, encoder_layers: int, decoder_layers: int, n_mels: int,
                              tokens_per_minute: float = 200.0, part: str = "all") -> float:
    """The formula written above the speech entries of catalog.toml (``part``: "all", or "decoder", the term
    that follows the transcript's length)."""
    d, f, v, frames, windows = spec.hidden, spec.intermediate, spec.vocab, 1500, 2
    le, ld = encoder_layers, decoder_layers
    encoder = (2 * le * (4 * d * d + 2 * d * f) * frames + 4 * frames ** 2 * d * le
               + 2 * 2 * frames * 3 * n_mels * d + 2 * frames * 3 * d * d)
    cross_kv = 2 * ld * 2 * d * d * frames
    before = tokens_per_minute / windows / 2
    token = (2 * ld * (4 * d * d + 2 * d * d + 2 * d * f) + 2 * v * d + 4 * frames * d * ld
             + 4 * before * d * ld)
    if part == "decoder":
        return tokens_per_minute * token / 1e9
    return (windows * (encoder + cross_kv) + tokens_per_minute * token) / 1e9


def test_whisper_compute_per_minute_follows_from_the_architecture(catalog):
    from controlplane import perf_arch

    for mid, (le, ld, mels) in WHISPER.items():
        spec = catalog[mid]
        assert spec.layers == le + ld, mid
        assert spec.gflops_per_unit == pytest.approx(whisper_gflops_per_minute(spec, le, ld, mels), abs=0.05), mid
        assert spec.decoder_gflops_per_unit == pytest.approx(
            whisper_gflops_per_minute(spec, le, ld, mels, part="decoder"), abs=0.05), mid
        assert spec.audio_window_s == 30.0, mid
        # The roofline charges the catalog figure alone: no layer, attention or element-wise term counted again.
        cost = perf_arch.prefill_pass(spec, perf_arch.scheme("fp16", True), [3])
        assert cost.gemm_flops == pytest.approx(3 * spec.gflops_per_unit * 1e9)
        assert (cost.attn_flops, cost.head_flops, cost.layers, cost.replicated_bytes, cost.sharded_bytes) == (0,) * 5


def test_the_ctc_stand_in_compute_per_minute_follows_from_its_graph_shape(catalog):
    from dataplane.models.speech import PRESETS

    spec, shape = catalog["@edgepop/ctc-small"], PRESETS["small"]
    assert (spec.layers, spec.hidden, spec.heads) == (shape.n_layer, shape.width, shape.n_head)
    frames, windows = shape.max_frames // 2, 2  # the conv stem halves the 30 s window's 10 ms frames
    encoder = whisper_gflops_per_minute(spec, spec.layers, 0, shape.n_mels, tokens_per_minute=0.0)
    head = windows * 2 * frames * spec.hidden * spec.vocab / 1e9
    assert spec.gflops_per_unit == pytest.approx(encoder + head, abs=0.05)


def test_gemma_3_12b_has_its_checkpoints_embedding_rows(catalog):
    # google/gemma-3-12b-it config.json, text_config: the LM head (tied embedding) is vocab_size x hidden_size.
    spec = catalog["@cf/google/gemma-3-12b-it"]
    assert (spec.vocab, spec.hidden, spec.layers, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate) == (
        262208, 3840, 48, 16, 8, 256, 15360)


def test_a_whisper_clip_pays_its_encoder_per_started_30_s_window(catalog):
    """Whisper's encoder reads 30 s of audio at a time: a 5 s clip is padded to one window, a 31 s clip is two."""
    from controlplane import perf_arch

    spec = catalog["@cf/openai/whisper-large-v3-turbo"]
    encoder = spec.gflops_per_unit - spec.decoder_gflops_per_unit  # per minute: two windows
    sch = perf_arch.scheme("fp16", True)

    def gflops(seconds):
        return perf_arch.prefill_pass(spec, sch, [seconds / 60.0]).gemm_flops / 1e9

    assert gflops(5) == pytest.approx(encoder / 2 + spec.decoder_gflops_per_unit * 5 / 60)
    assert gflops(30) == pytest.approx(encoder / 2 + spec.decoder_gflops_per_unit * 30 / 60)
    assert gflops(31) == pytest.approx(encoder + spec.decoder_gflops_per_unit * 31 / 60)
    assert gflops(60) == pytest.approx(spec.gflops_per_unit)
    assert gflops(150) == pytest.approx(5 * encoder / 2 + spec.decoder_gflops_per_unit * 150 / 60)
    # Clips batched together each pay their own windows.
    both = perf_arch.prefill_pass(spec, sch, [5 / 60.0, 31 / 60.0]).gemm_flops / 1e9
    assert both == pytest.approx(gflops(5) + gflops(31))


@pytest.mark.parametrize("fields, message", [
    ({"audio_window_s": 30}, "audio_window_s': applies to audio-minute models only"),
    ({"unit": "audio-minute", "task": "automatic-speech-recognition", "gflops_per_unit": 100.0,
      "decoder_gflops_per_unit": 150.0}, "decoder_gflops_per_unit': 150.0 is more than gflops_per_unit 100.0"),
    ({"unit": "audio-minute", "task": "automatic-speech-recognition", "gflops_per_unit": 100.0,
      "audio_window_s": -30}, "audio_window_s': -30 is not a non-negative number"),
])
def test_audio_window_fields_are_checked(tmp_path, fields, message):
    from controlplane.catalog import Catalog, CatalogError

    entry = {"task": "text-embeddings", "family": "bert", "parameters": 1e8, "precision": "fp16",
             "context_window": 512, "layers": 4, "hidden": 256, "neurons_per_m_input": 1000, "stand_in": "x",
             **fields}
    body = "\n".join(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in entry.items())
    path = tmp_path / "cat.toml"
    path.write_text(f'[models."@cf/x/y"]\n{body}\n')
    with pytest.raises(CatalogError, match=message.replace("(", r"\(")):
        Catalog.load(path)
