"""Stand-ins for the components a pipeline needs before it calls its transformer: a tokenizer, encoders built
small from their own `transformers` classes, image processors, and narrower VAEs. Real classes, built here."""

from __future__ import annotations

import pytest

from integrate.verify import standins


def test_the_tokenizer_pads_truncates_and_applies_a_chat_template():
    tok = standins.tokenizer()
    enc = tok("a small test prompt", padding="max_length", max_length=6, truncation=True, return_tensors="pt")
    assert enc["input_ids"].shape == (1, 6) and enc["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0]]
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert "hello" in tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.pad_token_id == 0 and len(tok) == standins.VOCAB


@pytest.mark.parametrize("name", ["UMT5EncoderModel", "SmolLM3ForCausalLM", "CLIPTextModel", "SiglipVisionModel"])
def test_an_encoder_is_its_own_class_narrowed_to_the_width_asked(name):
    import torch
    import transformers

    cls = getattr(transformers, name)
    model = standins.encoder(cls, 48)
    assert type(model) is cls and not model.training
    assert sum(p.numel() for p in model.parameters()) < standins.MAX_PARAMS
    if "Vision" in name:
        size = model.config.image_size
        out = model(pixel_values=torch.randn(1, 3, size, size), output_hidden_states=True)
    else:
        out = model(input_ids=torch.tensor([[4, 5, 1, 3]]), output_hidden_states=True)
    assert out.hidden_states[-1].shape[-1] == 48 and len(out.hidden_states) == standins.LAYERS + 1


def test_an_encoder_too_large_at_the_width_asked_is_refused_with_its_size():
    import transformers

    with pytest.raises(standins.NoStandIn, match="would have .* parameters"):
        standins.encoder(transformers.SmolLM3ForCausalLM, 4096)


def test_a_narrowed_vae_makes_latents_of_the_same_shape():
    """Only the channel widths inside the VAE shrink: latent channels and scale factors stay, so the
    transformer gets what the full VAE would give it."""
    import diffusers
    import torch

    cls = diffusers.AutoencoderKL
    full = {"block_out_channels": [128, 256, 512, 512], "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4, "latent_channels": 16}
    narrow = standins.narrow_channels(full)
    assert narrow["block_out_channels"] == [32, 32, 32, 32] and narrow["latent_channels"] == 16
    small, big = cls.from_config(narrow), cls.from_config(full)
    assert sum(p.numel() for p in small.parameters()) * 20 < sum(p.numel() for p in big.parameters())
    with torch.no_grad():
        latent = small.encode(torch.randn(1, 3, 64, 64)).latent_dist.mean
    assert latent.shape == (1, 16, 8, 8)


def test_which_components_stand_in():
    import transformers

    assert standins.is_transformers_model(transformers.CLIPVisionModel)
    assert not standins.is_transformers_model(transformers.PreTrainedModel)  # names no model to build
    assert standins.is_tokenizer(None, "tokenizer_2") and standins.is_tokenizer(transformers.CLIPTokenizer, "x")
    assert standins.is_tokenizer(transformers.AutoTokenizer, "tokenizer")
    from diffusers.pipelines.ace_step.pipeline_ace_step import AceStepAudioTokenizer

    assert not standins.is_tokenizer(AceStepAudioTokenizer, "audio_tokenizer")  # a model, whatever its name
    assert standins.is_image_processor(transformers.CLIPImageProcessor)
