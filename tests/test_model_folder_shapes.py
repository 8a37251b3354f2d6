"""From a model folder alone (issue #38): a transformer no pipeline of diffusers uses, planned transformer-only
from a config-only folder, whose statically synthesised inputs the plain tiny model refuses. The repair search
reads the failure (the inputs its message names, the model's own statement that raised) and swaps in each named
input as the forward's docstring documents it, recording every step with its evidence.

Real runs: the installed diffusers 0.42.1 classes, tiny random-weight models, workers.
"""

from __future__ import annotations

import inspect

from conftest import transformer_only, verify_json
from integrate.verify.inputs import tag_values
from integrate.verify.tiny import derive


def test_a_packed_sequence_is_made_as_the_forward_validates_and_documents_it(tmp_path):
    """MiniMax-H3 packs video, audio and text rows into one sequence its forward checks (`token_tags` and
    `timestep_indices` must be `(seq_len,)`): the repair search takes them, the position ids and the three
    streams' `*_indices` as documented, the sequence being the streams' rows together; the plain model runs."""
    plan_dir, out = transformer_only("MiniMaxH3Transformer3DModel", tmp_path)
    _, r = verify_json(plan_dir, out, "--proof", "cache")
    fx = r["fixture"]
    assert fx["status"] == "derived" and fx["source"] == "static", fx
    notes = [n for n in fx["notes"] if n.startswith("repair step")]
    assert notes and "its message names `token_tags`, `timestep_indices`, `position_ids`" in notes[0], notes
    assert "raises where `token_tags.shape != (sequence_length,)" in notes[0], notes  # the forward's own check
    assert any("transformer_minimax_h3.py:" in n and "reads `hidden_states`, `text_indices`" in n for n in notes)
    text = (out / "verify_fixture.py").read_text()
    assert '"video_indices": torch.arange(0, 16),' in text and '"text_indices": torch.arange(24, 30),' in text
    assert '"token_tags": torch.tensor([0, 0,' in text and "# repair step 1:" in text
    assert r["cache"]["status"] == "pass", r["cache"]


def test_streams_documented_over_one_length_share_it(tmp_path):
    """MiniMax Music 3 concatenates the latent `(batch, in_channels, length)` with the condition `(batch, length,
    condition_dim)`: the consumer of the concatenation is wider than the latent, and the condition's length was a
    text length. The failing `torch.cat` line reads both: they are taken as documented, one `length`."""
    plan_dir, out = transformer_only("MiniMaxMusic3Transformer1DModel", tmp_path)
    _, r = verify_json(plan_dir, out, "--proof", "tp")
    fx = r["fixture"]
    assert fx["status"] == "derived", fx
    assert any("reads `hidden_states`, `encoder_hidden_states`" in n and "the model ran" in n
               for n in fx["notes"]), fx["notes"]
    text = (out / "verify_fixture.py").read_text()
    header = text.split('"""')[1]  # each step, with its evidence, is in the fixture file's own docstring
    assert "repair step 1: the plain tiny model failed (RuntimeError: Sizes of tensors must match" in header
    assert "_randn('hidden_states', 1, 128, 4, step=step)" in text and "_randn('encoder_hidden_states', 1, 4, 32)" \
        in text
    assert r["tp"]["status"] == "pass", r["tp"]


def test_a_rope_width_inside_the_head_scales_with_it():
    """`rope_freq_dim` (H3: 2 * 3 * it of the head rotate) and `rotary_dim` (Music 3) are parts of the real head:
    the tiny config scales them with the head, so the rotated channels stay inside it."""
    from diffusers import MiniMaxH3Transformer3DModel, MiniMaxMusic3Transformer1DModel

    for cls, key, rotated in ((MiniMaxH3Transformer3DModel, "rope_freq_dim", 6),
                              (MiniMaxMusic3Transformer1DModel, "rotary_dim", 1)):
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                    if k != "self" and p.default is not inspect.Parameter.empty}
        tiny = derive(cls, defaults)
        assert tiny.error is None, tiny.error
        assert key in tiny.changes and tiny.config[key] * rotated <= tiny.config["attention_head_dim"], tiny.config


def test_the_values_an_entry_lists():
    assert tag_values("its modality: `0` video, `1` text, `2` audio.") == [(0, "video"), (1, "text"), (2, "audio")]
    assert tag_values("the index of its timestep in `timestep`.") == []
