"""Held-out workloads for the pool: recorded like record_traces.py's own, but never used to choose
the pool's rules — their traces (benches/traces_heldout/) check that a rule chosen on the other
traces holds on programs it was not chosen on. Same conventions: models built from their
configurations with random weights, random data, nothing downloaded; each function returns
step(i), which runs one iteration.

    python3 record_traces.py OUT_DIR --heldout [--only NAME,...]
"""
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda"


def step_on(opt, loss):
    """Backward, an optimizer step, gradients freed: the end of every training step here."""
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def autocast_loss(model, **inputs):
    """A Hugging Face model's loss under bf16 autocast (its backward runs outside, as usual)."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(**inputs).loss


def causal_lm_step(model, opt, rng, vocab, batch, lengths):
    """step(i) training `model` as a causal LM on random ids: `batch` rows, of a length drawn
    from `lengths` each step (by `rng`), under bf16 autocast."""

    def step(i):
        ids = torch.randint(0, vocab, (batch, rng.choice(lengths)), device=DEV)
        step_on(opt, autocast_loss(model, input_ids=ids, labels=ids))

    return step


def llama_train():
    """A LLaMA-style decoder's training step (8 layers, width 1024, SwiGLU, RoPE), batch 8,
    sequence length varying 256-1024 per step, bf16 autocast, AdamW."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=1024,
    )
    model = LlamaForCausalLM(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return causal_lm_step(model, opt, random.Random(11), 32000, 8, [256, 384, 512, 768, 1024])


def t5_train():
    """An encoder-decoder's training step: T5-small-like (6 + 6 layers, width 512), batch 16,
    source 64-512 and target 16-128 tokens varying per step, AdamW, fp32."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=32128, d_model=512, d_ff=2048, num_layers=6, num_heads=8,
        decoder_start_token_id=0, pad_token_id=0,
    )
    model = T5ForConditionalGeneration(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(12)

    def step(i):
        s, t = rng.choice([64, 128, 256, 512]), rng.choice([16, 32, 64, 128])
        src = torch.randint(0, 32128, (16, s), device=DEV)
        tgt = torch.randint(0, 32128, (16, t), device=DEV)
        loss = model(input_ids=src, labels=tgt).loss
        step_on(opt, loss)

    return step


def convnext_train():
    """An image model's training step: timm's ConvNeXt-Tiny, batch 32 at 224, channels-last,
    bf16 autocast, AdamW."""
    import timm

    model = timm.create_model("convnext_tiny", pretrained=False).to(DEV).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        x = torch.randn(32, 3, 224, 224, device=DEV).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (32,), device=DEV)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        step_on(opt, loss)

    return step


def swin_infer_batches():
    """A windowed-attention image model's inference at varying batch (1-48): timm's
    Swin-Tiny, fp16."""
    import timm

    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).to(DEV).half().eval()
    rng = random.Random(13)

    def step(i):
        x = torch.randn(rng.randint(1, 48), 3, 224, 224, device=DEV, dtype=torch.half)
        with torch.no_grad():
            model(x)

    return step


def lstm_train():
    """A recurrent network's training step: a 2-layer LSTM (width 1024, cuDNN) over sequences of
    50-200 steps, batch 64, a different length every step, Adam."""
    rnn = nn.LSTM(256, 1024, num_layers=2, batch_first=True).to(DEV)
    head = nn.Linear(1024, 256).to(DEV)
    opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()), lr=1e-3)
    rng = random.Random(14)

    def step(i):
        x = torch.randn(64, rng.randint(50, 200), 256, device=DEV)
        loss = F.mse_loss(head(rnn(x)[0]), x)
        step_on(opt, loss)

    return step


def gpt2_generate_batches():
    """A decoder generating greedily with a key/value cache at varying batch: HF GPT-2 (12 layers,
    width 768), batch 1-16, prompts of 16-128 tokens, 48 new tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).to(DEV).half().eval()
    rng = random.Random(15)

    def step(i):
        ids = torch.randint(0, 50257, (rng.randint(1, 16), rng.randint(16, 128)), device=DEV)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)

    return step


def cnn_tiny_train():
    """A heap under 64 MiB: a small convolutional classifier's training step on 28 x 28 images,
    batch 64, SGD with momentum."""
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
    ).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(i):
        x = torch.randn(64, 1, 28, 28, device=DEV)
        loss = F.cross_entropy(model(x), torch.randint(0, 10, (64,), device=DEV))
        step_on(opt, loss)

    return step


# --- session 17: six more programs, of kinds not among the traces before ---------------------------


def detection_train():
    """A detector's training step with images of varying shape: torchvision's Faster R-CNN
    (MobileNetV3-Large FPN backbone, random weights), batch 4, each image 320-640 by 320-640,
    1-8 random boxes each, SGD with momentum."""
    import torchvision

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=91, min_size=320, max_size=640
    ).to(DEV)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rng = random.Random(21)

    def target(h, w):
        n = rng.randint(1, 8)
        x0 = torch.rand(n, device=DEV) * (w - 32)
        y0 = torch.rand(n, device=DEV) * (h - 32)
        bw = 16 + torch.rand(n, device=DEV) * (w - x0 - 16)
        bh = 16 + torch.rand(n, device=DEV) * (h - y0 - 16)
        boxes = torch.stack([x0, y0, x0 + bw, y0 + bh], 1)
        return {"boxes": boxes, "labels": torch.randint(1, 91, (n,), device=DEV)}

    def step(i):
        shapes = [(rng.randint(320, 640), rng.randint(320, 640)) for _ in range(4)]
        images = [torch.rand(3, h, w, device=DEV) for h, w in shapes]
        losses = model(images, [target(h, w) for h, w in shapes])
        sum(losses.values()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def whisper_train():
    """A speech encoder-decoder's training step: Whisper-like (4 + 4 layers, width 384), batch 8,
    30 s of 80-bin log-mel input, transcripts of 32-224 tokens varying per step, bf16 autocast,
    AdamW."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(
        vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
        decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
    )
    model = WhisperForConditionalGeneration(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(22)

    def step(i):
        feats = torch.randn(8, 80, 3000, device=DEV)
        labels = torch.randint(0, 51865, (8, rng.choice([32, 64, 96, 160, 224])), device=DEV)
        step_on(opt, autocast_loss(model, input_features=feats, labels=labels))

    return step


def efficientnet_train():
    """Many small tensors: timm's EfficientNet-B0 training step (depthwise convolutions, squeeze
    and excitation), batch 64 at 224, channels-last, bf16 autocast, RMSprop."""
    import timm

    model = timm.create_model("efficientnet_b0", pretrained=False).to(DEV)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)

    def step(i):
        x = torch.randn(64, 3, 224, 224, device=DEV).to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), torch.randint(0, 1000, (64,), device=DEV))
        step_on(opt, loss)

    return step


def mixtral_train():
    """A sparse mixture-of-experts decoder's training step: HF Mixtral (4 layers, width 512, 8
    experts, 2 per token: each expert's batch is what the router sends it), batch 8, sequence
    length 128-512 varying per step, bf16 autocast, AdamW."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=512,
    )
    model = MixtralForCausalLM(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return causal_lm_step(model, opt, random.Random(24), 32000, 8, [128, 256, 384, 512])


def segmentation_infer_sizes():
    """A segmentation model's inference at varying batch and resolution: torchvision's
    DeepLabV3 (MobileNetV3-Large backbone, random weights), fp16, batch 1-8, 256-768 by
    256-768 pixels in steps of 64."""
    import torchvision

    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None
    ).to(DEV).half().eval()
    rng = random.Random(25)

    def step(i):
        h, w = 64 * rng.randint(4, 12), 64 * rng.randint(4, 12)
        with torch.no_grad():
            model(torch.randn(rng.randint(1, 8), 3, h, w, device=DEV, dtype=torch.half))

    return step


def bert_ckpt_train():
    """Activation checkpointing: a 24-layer transformer encoder (width 768, 12 heads, BERT-base's
    layer) trained as a masked LM with every layer recomputed in the backward pass
    (torch.utils.checkpoint), batch 16, sequence length 128-512 varying per step, bf16 autocast,
    AdamW."""
    from torch.utils.checkpoint import checkpoint

    emb = nn.Embedding(30522, 768).to(DEV)
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True)
        for _ in range(24)
    ).to(DEV)
    head = nn.Linear(768, 30522).to(DEV)
    params = list(emb.parameters()) + list(layers.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(26)

    def step(i):
        ids = torch.randint(0, 30522, (16, rng.choice([128, 256, 384, 512])), device=DEV)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = emb(ids)
            for layer in layers:
                x = checkpoint(layer, x, use_reentrant=False)
            loss = F.cross_entropy(head(x).flatten(0, 1), ids.flatten())
        step_on(opt, loss)

    return step


# --- session 19: six more, of kinds the traces above do not hold ----------------------------------


def opt_beam_generate():
    """Beam search: an OPT-like decoder (12 layers, width 768) generating with 4 beams, whose key/value
    cache is reordered by beam every token, batch 1-8, prompts of 32-160 tokens, 32 new tokens, fp16."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(
        vocab_size=50272, hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
        num_attention_heads=12, max_position_embeddings=2048, word_embed_proj_dim=768,
    )
    model = OPTForCausalLM(cfg).to(DEV).half().eval()
    rng = random.Random(31)

    def step(i):
        ids = torch.randint(4, 50272, (rng.randint(1, 8), rng.randint(32, 160)), device=DEV)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=32, min_new_tokens=32, num_beams=4, do_sample=False,
                           early_stopping=False, pad_token_id=1)

    return step


class _ResBlock(nn.Module):
    """A diffusion UNet's residual block: group norm, SiLU, 3x3 convolutions, the timestep added."""

    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x))) + self.t(t)[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class _Attn(nn.Module):
    """Self-attention over a feature map's positions (the UNet's lower resolutions)."""

    def __init__(self, c):
        super().__init__()
        self.n, self.a = nn.GroupNorm(32, c), nn.MultiheadAttention(c, 8, batch_first=True)

    def forward(self, x):
        b, c, h, w = x.shape
        s = self.n(x).flatten(2).transpose(1, 2)
        return x + self.a(s, s, s, need_weights=False)[0].transpose(1, 2).reshape(b, c, h, w)


class _UNet(nn.Module):
    """A latent-diffusion UNet (channels 128-256-512, attention at the two lower levels)."""

    def __init__(self, ch=(128, 256, 512), tdim=512):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(4, ch[0], 3, padding=1)
        self.down, self.up, cin, skips = nn.ModuleList(), nn.ModuleList(), ch[0], []
        for i, c in enumerate(ch):
            self.down.append(nn.ModuleList([_ResBlock(cin, c, tdim), _Attn(c) if i else nn.Identity()]))
            skips.append(c)
            cin = c
        self.mid = _ResBlock(cin, cin, tdim)
        for i, c in reversed(list(enumerate(ch))):
            self.up.append(nn.ModuleList([_ResBlock(cin + skips[i], c, tdim), _Attn(c) if i else nn.Identity()]))
            cin = c
        self.out = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, 4, 3, padding=1))

    def forward(self, x, t):
        half = self.tdim // 2
        f = torch.exp(-math.log(10000) * torch.arange(half, device=x.device) / half)
        e = t[:, None].float() * f[None]
        temb = self.temb(torch.cat([e.sin(), e.cos()], 1).to(x.dtype))
        h, hs = self.inp(x), []
        for i, (res, attn) in enumerate(self.down):
            h = attn(res(h, temb))
            hs.append(h)
            if i < len(self.down) - 1:
                h = F.avg_pool2d(h, 2)
        h = self.mid(h, temb)
        for i, (res, attn) in enumerate(self.up):
            h = attn(res(torch.cat([h, hs.pop()], 1), temb))
            if i < len(self.up) - 1:
                h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        return self.out(h)


def diffusion_unet_infer():
    """A diffusion model's sampling loop: a latent UNet (channels 128-512, attention at the lower
    levels) run 10 denoising steps with classifier-free guidance (the batch doubled), latents of
    32-96 by 32-96 in steps of 16, batch 1-4, fp16."""
    model = _UNet().to(DEV).half().eval()
    rng = random.Random(32)

    def step(i):
        b, h, w = rng.randint(1, 4), 16 * rng.randint(2, 6), 16 * rng.randint(2, 6)
        x = torch.randn(b, 4, h, w, device=DEV, dtype=torch.half)
        with torch.no_grad():
            for t in range(10, 0, -1):
                eps = model(torch.cat([x, x]), torch.full((2 * b,), t * 100, device=DEV))
                cond, unc = eps.chunk(2)
                x = x - 0.1 * (unc + 7.5 * (cond - unc))

    return step


def vit_accum_train():
    """Gradient accumulation: timm's ViT-Small trained on 4 micro-batches of 32 at 224 per
    optimizer step (the gradients live across them), bf16 autocast, AdamW."""
    import timm

    model = timm.create_model("vit_small_patch16_224", pretrained=False).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        for _ in range(4):
            x = torch.randn(32, 3, 224, 224, device=DEV)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), torch.randint(0, 1000, (32,), device=DEV)) / 4
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def roberta_infer_varlen():
    """An encoder serving requests: HF RoBERTa-base-like (12 layers, width 768) inference on
    batches of 1-64 padded to their longest sequence, 16-512 tokens, fp16."""
    from transformers import RobertaConfig, RobertaModel

    model = RobertaModel(RobertaConfig(max_position_embeddings=514)).to(DEV).half().eval()
    rng = random.Random(34)

    def step(i):
        b, n = rng.randint(1, 64), rng.randint(16, 512)
        ids = torch.randint(3, 50265, (b, n), device=DEV)
        mask = (torch.arange(n, device=DEV)[None] < torch.randint(1, n + 1, (b, 1), device=DEV)).long()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)

    return step


class _LoRA(nn.Module):
    """A frozen linear layer with a trained low-rank update (rank 16)."""

    def __init__(self, base, r=16):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(r, base.in_features, device=DEV) / r)
        self.b = nn.Parameter(torch.zeros(base.out_features, r, device=DEV))

    def forward(self, x):
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


def lora_finetune():
    """Parameter-efficient fine-tuning: a GPT-2-medium-like decoder (24 layers, width 1024) frozen,
    rank-16 adapters on every layer's attention and MLP projections trained, batch 4, sequence
    length 256-1024 varying per step, bf16 autocast, AdamW over the adapters only."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16)
    model = GPT2LMHeadModel(cfg).to(DEV)
    model.requires_grad_(False)
    for blk in model.transformer.h:
        # GPT-2's projections are Conv1D (weight in x out): each is replaced by a frozen Linear of
        # the same shape (random weights, as everywhere here) under an adapter.
        for mod, name in ((blk.attn, "c_attn"), (blk.attn, "c_proj"), (blk.mlp, "c_fc")):
            fan_in, fan_out = getattr(mod, name).weight.shape
            lin = nn.Linear(fan_in, fan_out).to(DEV).requires_grad_(False)
            setattr(mod, name, _LoRA(lin))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return causal_lm_step(model, opt, random.Random(35), 50257, 4, [256, 512, 768, 1024])


def dlrm_train():
    """A recommendation model's training step: 8 embedding tables of 400k rows by 64 (dense
    gradients the size of each table, made and freed every step), a bottom and a top MLP, feature
    interactions by dot products, batch 2048-8192 varying, Adagrad."""
    tables = nn.ModuleList(nn.EmbeddingBag(400_000, 64, mode="sum") for _ in range(8)).to(DEV)
    bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 64), nn.ReLU()).to(DEV)
    top = nn.Sequential(nn.Linear(64 + 36, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                        nn.Linear(512, 1)).to(DEV)
    params = list(tables.parameters()) + list(bottom.parameters()) + list(top.parameters())
    opt = torch.optim.Adagrad(params, lr=1e-2)
    rng = random.Random(36)

    def step(i):
        b = rng.choice([2048, 4096, 6144, 8192])
        dense = bottom(torch.randn(b, 13, device=DEV))
        feats = [dense] + [t(torch.randint(0, 400_000, (b, 20), device=DEV)) for t in tables]
        z = torch.stack(feats, 1)
        inter = torch.bmm(z, z.transpose(1, 2))
        iu = torch.triu_indices(9, 9, 1, device=DEV)
        x = torch.cat([dense, inter[:, iu[0], iu[1]]], 1)
        loss = F.binary_cross_entropy_with_logits(top(x).squeeze(1), torch.rand(b, device=DEV))
        step_on(opt, loss)

    return step


# Session 32: five more programs of kinds the pool had not seen, recorded after its rules were
# chosen (a dual encoder, a VAE, sequence-to-sequence generation, a decoder's prefill at varying
# shape, speech of varying length).


def clip_train():
    """A contrastive dual encoder's training step: a CLIP-like model (timm's ViT-Small as the image
    tower, a 6-layer text transformer of width 512), batch 128, captions of 16-77 tokens varying
    per step, bf16 autocast, AdamW."""
    import timm

    image = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=512).to(DEV)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
    text = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(DEV)
    embed = nn.Embedding(49408, 512).to(DEV)
    params = list(image.parameters()) + list(text.parameters()) + list(embed.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(41)

    def step(i):
        b, n = 128, rng.randint(16, 77)
        x = torch.randn(b, 3, 224, 224, device=DEV)
        ids = torch.randint(0, 49408, (b, n), device=DEV)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            zi = F.normalize(image(x), dim=-1)
            zt = F.normalize(text(embed(ids)).mean(1), dim=-1)
            logits = zi @ zt.t() * 14.3
            y = torch.arange(b, device=DEV)
            loss = (F.cross_entropy(logits, y) + F.cross_entropy(logits.t(), y)) / 2
        step_on(opt, loss)

    return step


def vae_train():
    """A convolutional VAE's training step: an encoder of 64-128-256-512 channels down to a
    32 x 32 x 4 latent and a mirrored decoder, images of 256 x 256, batch 16, fp32, Adam."""

    def down(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, 2, 1), nn.GroupNorm(32, o), nn.SiLU(),
                             nn.Conv2d(o, o, 3, 1, 1), nn.SiLU())

    def up(i, o):
        return nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(i, o, 3, 1, 1),
                             nn.GroupNorm(32, o), nn.SiLU(), nn.Conv2d(o, o, 3, 1, 1), nn.SiLU())

    enc = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1), down(64, 128), down(128, 256), down(256, 512),
                        nn.Conv2d(512, 8, 1)).to(DEV)
    dec = nn.Sequential(nn.Conv2d(4, 512, 3, 1, 1), up(512, 256), up(256, 128), up(128, 64),
                        nn.Conv2d(64, 3, 3, 1, 1)).to(DEV)
    opt = torch.optim.Adam(list(enc.parameters()) + list(dec.parameters()), lr=1e-4)

    def step(i):
        x = torch.randn(16, 3, 256, 256, device=DEV)
        mu, logvar = enc(x).chunk(2, 1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).mean()
        step_on(opt, F.mse_loss(dec(z), x) + 1e-3 * kl)

    return step


def t5_generate_batches():
    """A sequence-to-sequence model generating greedily with a key/value cache at varying batch: a
    T5-small-like encoder-decoder (6 + 6 layers, width 512), 1-32 sources of 32-256 tokens, 64 new
    tokens, fp16."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=32128, d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6,
                   num_heads=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(cfg).to(DEV).half().eval()
    rng = random.Random(42)

    def step(i):
        ids = torch.randint(2, 32128, (rng.randint(1, 32), rng.randint(32, 256)), device=DEV)
        with torch.no_grad():
            model.generate(input_ids=ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)

    return step


def neox_infer_varlen():
    """A decoder serving prompts, prefill only: a GPT-NeoX-like model (12 layers, width 1024, rotary
    attention) on batches of 1-32 prompts padded to 32-1024 tokens, no cache kept, fp16."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=50304, hidden_size=1024, num_hidden_layers=12,
                        num_attention_heads=16, intermediate_size=4096, max_position_embeddings=2048)
    model = GPTNeoXForCausalLM(cfg).to(DEV).half().eval()
    rng = random.Random(43)

    def step(i):
        ids = torch.randint(0, 50304, (rng.randint(1, 32), rng.randint(32, 1024)), device=DEV)
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    return step


def wav2vec2_train():
    """A speech encoder's training step with audio of varying length: a wav2vec2-base-like model
    (7 convolutional feature layers, 12 transformer layers of width 768) under a CTC loss, batch 8,
    2-8 s of 16 kHz audio per step, bf16 autocast, AdamW."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(vocab_size=32, ctc_loss_reduction="mean", pad_token_id=0)
    model = Wav2Vec2ForCTC(cfg).to(DEV).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(44)

    def step(i):
        seconds = rng.randint(2, 8)
        x = torch.randn(8, 16000 * seconds, device=DEV)
        labels = torch.randint(1, 32, (8, 12 * seconds), device=DEV)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_values=x, labels=labels).loss
        step_on(opt, loss)

    return step


HELDOUT = {
    "llama_train": (llama_train, 4),
    "t5_train": (t5_train, 4),
    "convnext_train": (convnext_train, 4),
    "swin_infer_batches": (swin_infer_batches, 12),
    "lstm_train": (lstm_train, 6),
    "gpt2_generate_batches": (gpt2_generate_batches, 3),
    "cnn_tiny_train": (cnn_tiny_train, 20),
    "detection_train": (detection_train, 6),
    "whisper_train": (whisper_train, 4),
    "efficientnet_train": (efficientnet_train, 4),
    "mixtral_train": (mixtral_train, 4),
    "segmentation_infer_sizes": (segmentation_infer_sizes, 12),
    "bert_ckpt_train": (bert_ckpt_train, 4),
    "opt_beam_generate": (opt_beam_generate, 3),
    "diffusion_unet_infer": (diffusion_unet_infer, 6),
    "vit_accum_train": (vit_accum_train, 4),
    "roberta_infer_varlen": (roberta_infer_varlen, 16),
    "lora_finetune": (lora_finetune, 4),
    "dlrm_train": (dlrm_train, 8),
    "clip_train": (clip_train, 4),
    "vae_train": (vae_train, 4),
    "t5_generate_batches": (t5_generate_batches, 3),
    "neox_infer_varlen": (neox_infer_varlen, 16),
    "wav2vec2_train": (wav2vec2_train, 6),
}
