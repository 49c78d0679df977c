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
