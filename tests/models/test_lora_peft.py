"""peft interop (`lora.save_adapter(format="peft")`, `lora.load_adapter`): our adapter exported in peft's
layout gives our logits in transformers + peft, and an adapter trained and saved by peft gives peft's logits
in ours; both layouts hold the same adapter bit for bit, and a malformed adapter folder is refused in one
line."""

import json
import pathlib

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scope_jax.envs import user_dialogues
from scope_jax.models import from_pretrained, init, lora

from .test_lora import CONFIG, EVERY, jit_forward, tiny_llama_with_adapter, tokens_and_positions, trained_like

PEFT_SETTINGS = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
                 "target_modules": list(EVERY.targets)}


@pytest.fixture(scope="module")
def adapter():
    graphdef, base = init(CONFIG, seed=0)
    _, fresh = lora.init(graphdef, base, EVERY, seed=1)
    return trained_like(fresh.adapter, 2)


def test_the_peft_layout_holds_the_same_adapter_bit_for_bit(adapter, tmp_path):
    lora.save_adapter(tmp_path / "ours", adapter, EVERY)
    lora.save_adapter(tmp_path / "peft", adapter, EVERY, format="peft", base_model="org/base")
    assert sorted(p.name for p in (tmp_path / "peft").iterdir()) == [lora.CONFIG_FILE, lora.PEFT_ADAPTER_FILE]
    settings = json.loads((tmp_path / "peft" / lora.CONFIG_FILE).read_text())
    assert settings.items() >= {**PEFT_SETTINGS, "base_model_name_or_path": "org/base"}.items()
    tensors = load_file(str(tmp_path / "peft" / lora.PEFT_ADAPTER_FILE))
    assert len(tensors) == 2 * CONFIG.num_layers * len(EVERY.targets)
    down = adapter["layers"]["mlp"]["down_proj"]  # A [layers, in 128, rank 4], B [layers, rank 4, out 64]
    np.testing.assert_array_equal(tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"],
                                  np.asarray(down["lora_a"][1]).T)
    np.testing.assert_array_equal(tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"],
                                  np.asarray(down["lora_b"][1]).T)
    (ours_config, ours), (peft_config, peft) = (lora.load_adapter(tmp_path / f) for f in ("ours", "peft"))
    assert peft_config == ours_config == EVERY
    assert jax.tree.structure(peft) == jax.tree.structure(ours)
    jax.tree.map(np.testing.assert_array_equal, peft, ours)
    lora.save_adapter(tmp_path / "ours", adapter, EVERY, format="peft")  # replaces the other layout's file
    assert lora.adapter_weights_file(tmp_path / "ours").name == lora.PEFT_ADAPTER_FILE
    assert not (tmp_path / "ours" / lora.ADAPTER_FILE).exists()


def test_the_committed_p4g_proxy_ships_in_peft_layout_only():
    folder = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "p4g_proxy" / "adapter"
    assert sorted(p.name for p in folder.iterdir()) == sorted([lora.CONFIG_FILE, lora.PEFT_ADAPTER_FILE,
                                                                user_dialogues.FIT_FILE])
    assert json.loads((folder / user_dialogues.FIT_FILE).read_text())["purpose"] == "judge"
    config, _ = lora.load_adapter(folder)
    assert config == lora.LoRAConfig(rank=8, alpha=16.0, targets=lora.ATTENTION_TARGETS)


def _without(key):
    return lambda tensors: {k: v for k, v in tensors.items() if k != key}


def _with(key):
    return lambda tensors: {**tensors, key: np.zeros((4, 64), np.float32)}


Q_B0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
MALFORMED = [  # (what is changed in a peft-layout folder: settings, tensors, raw text of the settings; error)
    (dict(settings={"peft_type": "IA3"}), "has peft_type 'IA3', not 'LORA'"),
    (dict(settings={"use_rslora": True}), "sets use_rslora = True"),
    (dict(settings={"use_dora": True}), "sets use_dora = True"),
    (dict(settings={"alpha_pattern": {"q_proj": 4}}), "sets alpha_pattern"),
    (dict(settings={"r": 8}), "q_proj's lora_A has rank 4, not r = 8"),
    (dict(settings={"r": None, "lora_alpha": None}), "lacks r or lora_alpha"),
    (dict(text="{not json"), "is not JSON"),
    (dict(tensors=_with("base_model.model.lm_head.lora_A.weight")), "is not a LoRA factor"),
    (dict(tensors=_with("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight")), "is not a LoRA factor"),
    (dict(tensors=_without(Q_B0)), "q_proj lacks lora_A or lora_B in some of layers 0..1"),
    (dict(tensors=lambda tensors: {}), "holds no LoRA factor"),
]


@pytest.mark.parametrize("change, error", MALFORMED, ids=[e for _, e in MALFORMED])
def test_a_malformed_peft_adapter_is_refused_in_one_line(adapter, tmp_path, change, error):
    lora.save_adapter(tmp_path, adapter, EVERY, format="peft")
    settings = json.loads((tmp_path / lora.CONFIG_FILE).read_text()) | change.get("settings", {})
    settings = {k: v for k, v in settings.items() if v is not None}
    (tmp_path / lora.CONFIG_FILE).write_text(change.get("text", json.dumps(settings)))
    weights = str(tmp_path / lora.PEFT_ADAPTER_FILE)
    save_file(change.get("tensors", dict)(load_file(weights)), weights)
    with pytest.raises(ValueError) as raised:
        lora.load_adapter(tmp_path)
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_an_adapter_folder_of_no_or_both_layouts_or_foreign_settings_is_refused(adapter, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not an adapter folder: it needs adapter_config.json"):
        lora.load_adapter(tmp_path)
    lora.save_adapter(tmp_path, adapter, EVERY, format="peft")
    (tmp_path / lora.ADAPTER_FILE).write_bytes((tmp_path / lora.PEFT_ADAPTER_FILE).read_bytes())
    with pytest.raises(ValueError, match="which adapter is ambiguous"):
        lora.load_adapter(tmp_path)
    (tmp_path / lora.PEFT_ADAPTER_FILE).unlink()  # peft's settings beside our layout's weights
    with pytest.raises(ValueError, match="is not a scope_jax adapter's settings: .*'peft_type'"):
        lora.load_adapter(tmp_path)
    with pytest.raises(ValueError, match="format 'gguf' is not one of"):
        lora.save_adapter(tmp_path, adapter, EVERY, format="gguf")
    with pytest.raises(ValueError, match="records no base model"):
        lora.save_adapter(tmp_path, adapter, EVERY, base_model="org/base")


@pytest.mark.torch
def test_our_adapter_exported_to_peft_gives_our_logits_in_transformers(tiny_hf, tmp_path):
    """Random non-zero A and B on all seven projections of a tiny Llama, saved in peft's layout, loaded by
    `peft.PeftModel.from_pretrained` on the same base in transformers."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    folder, graphdef, base, lora_graphdef, params = tiny_llama_with_adapter(tiny_hf, scale=0.1)
    lora.save_adapter(tmp_path, params.adapter, EVERY, format="peft", base_model=str(folder))
    reference = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), tmp_path).eval()
    tokens, positions = tokens_and_positions(5, vocab=reference.config.vocab_size)
    with torch.no_grad():
        theirs = reference(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
    ours, _ = jit_forward(lora_graphdef, params, tokens, positions)
    plain, _ = jit_forward(graphdef, base, tokens, positions)
    assert np.max(np.abs(np.asarray(ours) - np.asarray(plain))) > 0.1  # the adapter matters
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


@pytest.mark.torch
def test_an_adapter_trained_and_saved_by_peft_gives_peft_logits_in_ours(tiny_hf, tmp_path):
    """peft's LoRA (its own init) on all seven projections of a tiny Llama, one AdamW step of the causal-LM
    loss (B leaves zero), `save_pretrained`; `lora.load` of that folder on our load of the same base."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    folder, _ = tiny_hf("llama")
    torch.manual_seed(0)
    model = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
        peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(EVERY.targets)))
    train_tokens = torch.as_tensor(np.random.default_rng(6).integers(0, model.config.vocab_size, (2, 12)))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    model(train_tokens, labels=train_tokens).loss.backward()
    optimizer.step()
    model.eval()
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert len(lora_b) == 2 * 7 and all(bool(p.abs().max() > 0) for p in lora_b)
    model.save_pretrained(tmp_path)
    tokens, positions = tokens_and_positions(7, vocab=model.config.vocab_size)
    with torch.no_grad():
        theirs = model(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()

    _, (graphdef, base), _ = from_pretrained(folder)
    lora_graphdef, params = lora.load(tmp_path, graphdef, base)
    ours, _ = jit_forward(lora_graphdef, params, tokens, positions)
    plain, _ = jit_forward(graphdef, base, tokens, positions)
    assert np.max(np.abs(np.asarray(ours) - np.asarray(plain))) > 0.1  # the step matters
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)
    assert lora.load_adapter(tmp_path)[0] == EVERY  # r 4, alpha 8, the seven projections
