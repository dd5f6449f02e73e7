"""``pypto_sched.LLM``: a model directory saved by transformers (weights, tokenizer, chat
template, generation config) in, text out; checked against transformers itself (its
tokenizer, its ``apply_chat_template`` and its greedy ``generate()``) and against
:func:`pypto_sched.generate`, of which it is a thin layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from pypto_sched import (
    LLM,
    IncompleteGenerationError,
    InvalidConfigError,
    InvalidInputError,
    PlannerConfig,
    SamplingParams,
    generate,
    load_backend,
)
from pypto_sched.chat import ChatTemplate
from pypto_sched_reference import TINY_MODEL, ReferenceBackend

torch = pytest.importorskip("torch", reason="the model is saved by transformers, on torch")
transformers = pytest.importorskip("transformers", reason="the oracle is transformers")
tokenizers = pytest.importorskip("tokenizers", reason="text needs the tokenizers library")
pytest.importorskip("jinja2", reason="chat templates need jinja2")

VOCAB = TINY_MODEL.vocab_size
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
WORDS = ["<unk>", *SPECIAL, "system", "user", "assistant", "the", "cat", "sat", "on", "mat",
         "hello", "you", "are", "a", "bot", "é"]  # fmt: skip
# A ChatML template written for these tests, with what real templates use: a namespace set
# in a loop, loop controls, raise_exception, tojson and the special tokens as variables.
TEMPLATE = (
    "{% set ns = namespace(system=false) %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role'] | tojson) }}"
    "{% endif %}"
    "{% if message['role'] == 'system' %}{% set ns.system = true %}{% endif %}"
    "{% if message['content'] == 'skip' %}{% continue %}{% endif %}\n"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{% if not ns.system %}{{ eos_token }}{% endif %}"
    "{% if tools is not none %}{{ raise_exception('tools given') }}{% endif %}"
    "{% if messages | length > 9 %}{{ documents | length }}{% endif %}"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 and its tokenizer, both saved by transformers."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.1,
        eos_token_id=2,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("llm") / "model"
    transformers.Qwen3ForCausalLM(config).save_pretrained(directory)
    vocab = {word: i for i, word in enumerate(WORDS)}
    vocab.update({f"w{i}": i for i in range(len(WORDS), VOCAB)})
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    core.decoder = tokenizers.decoders.WordPiece(prefix="##")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", eos_token="<|im_end|>",
        pad_token="<|endoftext|>", additional_special_tokens=SPECIAL[:1],
    )  # fmt: skip
    fast.chat_template = TEMPLATE
    fast.save_pretrained(directory)
    return directory


def hf_tokenizer(directory: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(directory)


CONVERSATIONS = [
    [{"role": "user", "content": "hello the cat"}],
    [
        {"role": "system", "content": "you are a bot"},
        {"role": "user", "content": "skip"},
        {"role": "user", "content": "the cat sat on the mat é"},
    ],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_chat_template_renders_and_tokenizes_as_transformers_does(
    model: Path, conversation: list[dict[str, str]], generation_prompt: bool
) -> None:
    theirs = hf_tokenizer(model)
    ours = ChatTemplate.from_directory(model)
    assert ours is not None
    text = ours.render(conversation, add_generation_prompt=generation_prompt)
    expected = theirs.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=generation_prompt
    )
    assert text == expected
    ids = theirs.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=generation_prompt
    )
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    llm = LLM(model)
    (output,) = llm.generate([conversation], SamplingParams(max_tokens=1))
    if generation_prompt:
        assert output.prompt == text
        assert list(output.prompt_token_ids) == list(ids)


def test_a_template_that_raises_is_an_error_with_its_message(model: Path) -> None:
    llm = LLM(model)
    with pytest.raises(InvalidInputError, match=r"failed: TemplateError: unknown role \"tool\""):
        llm.chat([{"role": "tool", "content": "x"}])


def test_text_prompts_are_tokenized_as_transformers_tokenizes_them(model: Path) -> None:
    theirs = hf_tokenizer(model)
    llm = LLM(model)
    prompts = ["the cat sat", "hello you"]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=2))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert list(output.prompt_token_ids) == theirs(prompt)["input_ids"]
        assert output.prompt == prompt
        assert output.text == theirs.decode(list(output.token_ids), skip_special_tokens=True)


def test_greedy_tokens_are_transformers_generate_tokens(model: Path) -> None:
    llm = LLM(model, generation_config=None)
    prompts = [[5, 9, 13, 4], [7, 7, 7, 7, 7, 7, 7, 7, 7]]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64)
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = torch.tensor([prompt])
        theirs = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )[0, len(prompt) :].tolist()  # fmt: skip
        assert list(output.token_ids) == theirs


def test_it_is_a_thin_layer_over_generate(model: Path) -> None:
    llm = LLM(model, config=PlannerConfig(max_num_batched_tokens=8, policy="round_robin"))
    params = [SamplingParams(temperature=0.9, seed=4, max_tokens=5),
              SamplingParams(max_tokens=3, logprobs=2)]  # fmt: skip
    prompts = [[5, 9, 13], [8, 8]]
    outputs = llm.generate(prompts, params)
    direct = generate(
        llm.backend, prompts, config=PlannerConfig(max_num_batched_tokens=64),
        sampling=params, stop_token_ids=llm.eos_token_ids,
    ).sequences  # fmt: skip
    for output, sequence in zip(outputs, direct, strict=True):
        assert list(output.token_ids) == sequence.token_ids.tolist()
        assert output.finish_reason == sequence.finish_reason
    assert outputs[0].logprobs is None
    assert outputs[1].logprobs is not None
    assert outputs[1].top_logprobs is not None
    assert [len(top) for top in outputs[1].top_logprobs] == [2, 2, 2]


def test_a_stop_string_ends_the_text_before_it(model: Path) -> None:
    llm = LLM(model)
    free = llm.generate("the cat", SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert free.text is not None
    words = free.text.split(" ")
    stop = words[2]
    cut = llm.generate("the cat", SamplingParams(max_tokens=8, ignore_eos=True, stop=stop))[0]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    assert cut.text == free.text[: free.text.index(stop)]
    assert len(cut.token_ids) == words.index(stop) + 1  # the token that completed it is kept


def test_the_models_eos_ids_stop_requests_unless_ignored(model: Path) -> None:
    llm = LLM(model, generation_config=None)
    assert llm.eos_token_ids == (2,)  # from the checkpoint's generation config
    outputs = llm.generate([[5, 9, 13], [8, 8], [4]], SamplingParams(max_tokens=12))
    for output in outputs:
        assert output.finish_reason == "length" or output.stop_reason == 2


def test_the_generation_configs_defaults_apply_unless_turned_off(
    tmp_path: Path, model: Path
) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    for file in model.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    config = json.loads((directory / "generation_config.json").read_text())
    config.update(temperature=0.7, top_k=20, top_p=0.8, max_new_tokens=5, do_sample=True)
    (directory / "generation_config.json").write_text(json.dumps(config))
    auto = LLM(directory)
    assert auto.get_default_sampling_params() == SamplingParams(
        temperature=0.7, top_k=20, top_p=0.8, max_tokens=5
    )
    assert LLM(directory, generation_config=None).get_default_sampling_params() == SamplingParams()
    (output,) = auto.generate("the cat")
    assert len(output.token_ids) <= 5
    config.update(repetition_penalty=1.1)
    (directory / "generation_config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="sets repetition_penalty 1.1, which pypto_sched does"):
        LLM(directory)


def test_a_backend_failure_keeps_the_finished_outputs(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = LLM(model, num_kv_pages=4, kv_page_size=4)
    original = ReferenceBackend.run_dispatch
    calls: list[int] = []

    def failing(self: ReferenceBackend, batch: Any, cache: Any) -> Any:
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("the device went away")
        return original(self, batch, cache)

    monkeypatch.setattr(ReferenceBackend, "run_dispatch", failing)
    prompts = [[5], [6, 6, 6, 6, 6, 6], [7, 7, 7, 7, 7, 7, 7, 7]]
    with pytest.raises(IncompleteGenerationError, match="not finished: requests") as caught:
        llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 6, 6)])
    error = caught.value
    assert error.outputs[0] is not None
    assert error.outputs[0].token_ids
    assert set(error.unfinished) == {r for r, o in enumerate(error.outputs) if o is None}
    assert error.unfinished


def test_bad_prompts_are_named(model: Path) -> None:
    llm = LLM(model)
    with pytest.raises(InvalidInputError, match="'prompts'"):
        llm.generate([])
    with pytest.raises(InvalidInputError, match=r"prompts\[1\]"):
        llm.generate(["the cat", 3.5])  # type: ignore[arg-type]


def test_a_backend_object_and_numpy_ids_are_taken(model: Path) -> None:
    backend = load_backend("reference", checkpoint=str(model))
    llm = LLM(model, backend=backend)
    (output,) = llm.generate(np.array([5, 9, 13]), SamplingParams(max_tokens=2))
    assert output.prompt is None
    assert output.prompt_token_ids == (5, 9, 13)


def test_outputs_holds_the_completion_as_vllm_does(model: Path) -> None:
    llm = LLM(model)
    (output,) = llm.generate("the cat", SamplingParams(max_tokens=4, logprobs=1))
    (completion,) = output.outputs
    assert output.request_id == "0"
    assert output.finished
    assert completion.index == 0
    assert (completion.text, completion.token_ids) == (output.text, output.token_ids)
    assert (completion.finish_reason, completion.stop_reason) == (
        output.finish_reason,
        output.stop_reason,
    )
    assert completion.logprobs == output.logprobs
    assert completion.logprobs is not None
    assert completion.cumulative_logprob == pytest.approx(sum(completion.logprobs))
    (plain,) = llm.generate("the cat", SamplingParams(max_tokens=4))
    assert plain.outputs[0].cumulative_logprob is None


def test_n_completions_of_a_prompt_leave_the_other_prompts_alone(model: Path) -> None:
    llm = LLM(model, config=PlannerConfig(max_num_batched_tokens=8))
    prompts = [[5, 9, 13], [8, 8], [4, 6, 7, 7]]
    hot = SamplingParams(temperature=5.0, seed=3, max_tokens=6, ignore_eos=True)
    alone = llm.generate(prompts, hot)
    params = [hot, attrs.evolve(hot, n=4), hot]
    seen: list[int] = []
    outputs = llm.generate(prompts, params, on_finish=lambda o: seen.append(o.index))
    assert sorted(seen) == [0, 1, 2]  # each prompt heard of once, with all its completions
    assert [len(o.outputs) for o in outputs] == [1, 4, 1]
    for one, many in zip(alone, outputs, strict=True):
        assert many.outputs[0] == one.outputs[0]  # completion 0 is the request without n
        assert many.token_ids == one.token_ids
    completions = outputs[1].outputs
    assert [c.index for c in completions] == [0, 1, 2, 3]
    assert len({c.token_ids for c in completions}) > 1  # sampled apart
    again = llm.generate(prompts, params)
    assert again == outputs  # and reproducibly


def test_n_greedy_completions_are_equal(model: Path) -> None:
    llm = LLM(model)
    (output,) = llm.generate([5, 9, 13], SamplingParams(max_tokens=5, n=3))
    assert len({(c.token_ids, c.text) for c in output.outputs}) == 1


def test_n_is_checked_and_generate_runs_one_sequence_a_request(model: Path) -> None:
    with pytest.raises(InvalidConfigError, match="'n' must be >= 1: 0"):
        SamplingParams(n=0)
    llm = LLM(model)
    with pytest.raises(InvalidInputError, match=r"'sampling\[0\].n' must be 1"):
        generate(llm.backend, [[5, 9]], config=llm.config, sampling=SamplingParams(n=2))


def test_vllms_scheduler_knobs_build_the_config(model: Path) -> None:
    llm = LLM(
        model, max_num_batched_tokens=16, max_num_seqs=2, long_prefill_token_threshold=8,
        max_num_partial_prefills=1, block_size=4, num_gpu_blocks_override=64,
    )  # fmt: skip
    assert llm.config == PlannerConfig(
        max_num_batched_tokens=16, max_num_seqs=2, long_prefill_token_threshold=8,
        max_num_partial_prefills=1, policy="packed",
    )  # fmt: skip
    assert (llm.kv_page_size, llm.num_kv_pages) == (4, 64)
    # vLLM's 0 is "off"; unset is packed with vLLM's offline budget.
    assert LLM(model, long_prefill_token_threshold=0).config == PlannerConfig(
        max_num_batched_tokens=8192, policy="packed"
    )
    assert LLM(model, policy="round_robin").config.policy == "round_robin"
    outputs = llm.generate([[5, 9, 13, 4, 4, 4, 4, 4, 4, 4], [8, 8]], SamplingParams(max_tokens=3))
    assert [len(o.token_ids) for o in outputs] == [3, 3]


def test_knobs_and_a_config_or_two_names_of_one_knob_are_refused(model: Path) -> None:
    with pytest.raises(InvalidInputError, match="give 'config' or 'max_num_seqs', not both"):
        LLM(model, config=PlannerConfig(max_num_batched_tokens=8), max_num_seqs=2)
    with pytest.raises(InvalidInputError, match="give 'kv_page_size' or vLLM's name"):
        LLM(model, kv_page_size=8, block_size=4)
    with pytest.raises(InvalidInputError, match="give 'kv_page_size' or vLLM's name"):
        LLM(model, kv_page_size=16, block_size=32)  # (16, the default, given by name: given)
    assert LLM(model, kv_page_size=4, block_size=4).kv_page_size == 4  # (they agree)
    with pytest.raises(InvalidConfigError, match="'max_num_seqs' must be >= 1: 0"):
        LLM(model, max_num_seqs=0)
    with pytest.raises(InvalidConfigError, match="'long_prefill_token_threshold' must be >= 0"):
        LLM(model, long_prefill_token_threshold=-1)
