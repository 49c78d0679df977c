"""``edgepop estimate``: flags that do not apply to a model, and a decode context shorter than the prompt."""

from __future__ import annotations

import json

import pytest

from edgepop.cli import main

L8 = "@cf/meta/llama-3.1-8b-instruct"


@pytest.mark.parametrize("args,message", [
    (["--model", L8, "--gpu", "L4", "--context", "0"], "--context 0 is less than --prompt-tokens 512"),
    (["--model", L8, "--gpu", "L4", "--prompt-tokens", "200", "--context", "199.5"],
     "--context 199.5 is less than --prompt-tokens 200"),
    (["--model", "@cf/openai/whisper", "--gpu", "L4", "--output-tokens", "5"],
     "--output-tokens 5: applies to language models only; @cf/openai/whisper is a speech model"),
    (["--model", "@cf/microsoft/resnet-50", "--gpu", "L4", "--context", "10"],
     "--context 10: applies to language models only; @cf/microsoft/resnet-50 is an image model"),
    (["--model", "@cf/openai/whisper", "--gpu", "L4", "--kv-precision", "fp8"],
     "--kv-precision fp8: applies to language models only"),
    (["--model", "@cf/microsoft/resnet-50", "--gpu", "L4", "--output-tokens", "128"],  # the default, given
     "--output-tokens 128: applies to language models only"),
])
def test_estimate_refuses_a_flag_that_would_be_ignored_or_a_context_below_the_prompt(capsys, args, message):
    assert main(["estimate", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("edgepop: error: ") and message in err


def test_estimate_defaults_still_apply_when_the_flags_are_not_given(capsys):
    assert main(["estimate", "--model", L8, "--gpu", "L4", "--prompt-tokens", "200", "--context", "200",
                 "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["output_tokens"] == 128 and est["context"] == 200
    assert main(["estimate", "--model", "@cf/microsoft/resnet-50", "--gpu", "L4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output_tokens"] == 0
