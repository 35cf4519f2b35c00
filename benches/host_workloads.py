"""Workloads recorded on a machine without a GPU (record_host_traces.py): programs of kinds the
other trace sets do not hold, sized for two CPU cores. Like heldout_workloads.py's, their traces
only check the pool's rules, never choose them. Same conventions: models built from their
configurations with random weights, random data, nothing downloaded; each function returns
step(i), which runs one iteration. The three servers after wgan_gp_train (session 51) were
recorded on a GPU only (`run.sh hostgpu`, `../traces_hostgpu/`). The five programs after them
(session 53: a transducer's joint network, a Fourier neural operator, an input pipeline on a side
stream, point-cloud neighbourhoods, K-FAC's eigendecompositions) were recorded on the CPU
(`../traces_host/`), and on a GPU in session 54 (`../traces_hostgpu/`). mean_teacher_side_train
(session 55: a teacher on a side stream of its own) was recorded on a GPU only: on the CPU it
has one stream, which is not what it is for. Session 57's ten are in host_workloads_phased.py and
session 58's five in host_workloads_inner.py, listed in HOST after these in that order.

    python3 record_host_traces.py OUT_DIR [--only NAME,...]
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cpu"


def record_stream(t, stream):
    """`t.record_stream(stream)`; torch_workloads.py replaces it with one that gkrt's pool hears
    too when gkrt's pool is PyTorch's allocator (a pluggable allocator never hears of it)."""
    t.record_stream(stream)


def step_on(opt, loss):
    """Backward, an optimizer step, gradients freed: the end of every training step here."""
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def causal_lm_step(model, opt, rng, vocab, batch, lengths):
    """step(i) training `model` as a causal LM on random ids: `batch` rows, of a length drawn
    from `lengths` each step (by `rng`)."""

    def step(i):
        ids = torch.randint(0, vocab, (batch, rng.choice(lengths)), device=DEV)
        step_on(opt, model(input_ids=ids, labels=ids).loss)

    return step


def generate_step(model, rng, first_id, vocab, batches, prompts, new, requests=1, **how):
    """step(i) generating with `model`, no gradients, for `requests` requests one after the
    other: each a batch of rows (their count drawn from `batches`, a (low, high) pair, by `rng`)
    of random ids from `first_id` on, of a prompt length drawn from `prompts`, and a number of
    new tokens drawn from `new`; `how` goes to generate."""

    def step(i):
        for _ in range(requests):
            shape = (rng.randint(*batches), rng.randint(*prompts))
            ids = torch.randint(first_id, vocab, shape, device=DEV)
            n = rng.randint(*new)
            with torch.no_grad():
                model.generate(ids, min_new_tokens=n, max_new_tokens=n, **how)

    return step


def distilbert_cls_train():
    """An encoder fine-tuned for classification: DistilBERT (6 layers, width 512), batch 8,
    sequence length varying 64-256 per step, AdamW."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(dim=512, hidden_dim=2048, n_layers=6, n_heads=8, num_labels=4)
    model = DistilBertForSequenceClassification(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(11)

    def step(i):
        n = rng.choice([64, 96, 128, 192, 256])
        ids = torch.randint(0, cfg.vocab_size, (8, n), device=DEV)
        labels = torch.randint(0, 4, (8,), device=DEV)
        step_on(opt, model(input_ids=ids, labels=labels).loss)

    return step


def albert_mlm_train():
    """A model whose layers share their weights: ALBERT (one layer applied 8 times, width 512,
    embeddings of 128), masked LM, batch 8, sequence 128, gradients accumulated over 2
    micro-batches, AdamW."""
    from transformers import AlbertConfig, AlbertForMaskedLM

    cfg = AlbertConfig(
        hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048
    )
    model = AlbertForMaskedLM(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        for _ in range(2):
            ids = torch.randint(0, cfg.vocab_size, (8, 128), device=DEV)
            model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def mobilenet_train():
    """A mobile CNN's training step: torchvision MobileNetV3-Large, batch 16, images 160x160,
    SGD with momentum (many small activations and weights)."""
    import torchvision

    model = torchvision.models.mobilenet_v3_large(num_classes=100).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(i):
        x = torch.randn(16, 3, 160, 160, device=DEV)
        y = torch.randint(0, 100, (16,), device=DEV)
        step_on(opt, F.cross_entropy(model(x), y))

    return step


def bart_generate():
    """An encoder-decoder generating: BART (3+3 layers, width 512), batch 4, prompts of 32-128
    tokens, 24-48 new tokens, beam search of 3, a fresh cache per request."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(
        d_model=512,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        vocab_size=16000,
    )
    model = BartForConditionalGeneration(cfg).to(DEV).eval()
    rng = random.Random(12)

    def step(i):
        ids = torch.randint(4, cfg.vocab_size, (4, rng.randint(32, 128)), device=DEV)
        n = rng.randint(24, 48)
        with torch.no_grad():
            model.generate(
                ids, num_beams=3, min_new_tokens=n, max_new_tokens=n, do_sample=False
            )

    return step


def deit_infer_batches():
    """A vision transformer serving batches of varying size: timm DeiT-Small/16, batch 1-24,
    224x224, no gradients."""
    import timm

    model = timm.create_model("deit_small_patch16_224", pretrained=False).to(DEV).eval()
    rng = random.Random(13)

    def step(i):
        with torch.no_grad():
            model(torch.randn(rng.randint(1, 24), 3, 224, 224, device=DEV))

    return step


class _Seq2Seq(nn.Module):
    """A GRU encoder-decoder with attention over the encoder's states (teacher forcing)."""

    def __init__(s, vocab=8000, d=384):
        super().__init__()
        s.emb = nn.Embedding(vocab, d)
        s.enc = nn.GRU(d, d, num_layers=2, batch_first=True, bidirectional=True)
        s.bridge = nn.Linear(2 * d, d)
        s.dec = nn.GRU(3 * d, d, num_layers=2, batch_first=True)
        s.attn = nn.Linear(d, 2 * d)
        s.out = nn.Linear(3 * d, vocab)

    def forward(s, src, tgt):
        mem, _ = s.enc(s.emb(src))
        ctx = mem.mean(1, keepdim=True).expand(-1, tgt.shape[1], -1)
        h, _ = s.dec(torch.cat([s.emb(tgt), ctx], -1))
        w = torch.softmax(s.attn(h) @ mem.transpose(1, 2), -1)
        return s.out(torch.cat([h, w @ mem], -1))


def gru_seq2seq_train():
    """A recurrent translation model's training step: GRU encoder-decoder with attention (width
    384), batch 32, source and target lengths varying 16-64 per step, Adam."""
    model = _Seq2Seq().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(14)

    def step(i):
        src = torch.randint(0, 8000, (32, rng.randint(16, 64)), device=DEV)
        tgt = torch.randint(0, 8000, (32, rng.randint(16, 64)), device=DEV)
        logits = model(src, tgt[:, :-1])
        step_on(opt, F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()))

    return step


def deeplab_train_sizes():
    """A segmentation model trained on images of varying size: torchvision DeepLabV3 with a
    MobileNetV3 backbone, batch 4, sides 192-320 per step, 21 classes, SGD with momentum."""
    import torchvision

    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        num_classes=21, weights=None, weights_backbone=None, aux_loss=False
    ).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(15)

    def step(i):
        h, w = rng.choice([192, 256, 320]), rng.choice([192, 256, 320])
        x = torch.randn(4, 3, h, w, device=DEV)
        y = torch.randint(0, 21, (4, h, w), device=DEV)
        step_on(opt, F.cross_entropy(model(x)["out"], y))

    return step


def qwen_moe_train():
    """A mixture-of-experts decoder's training step: Qwen2-MoE (4 layers, width 384, 8 experts,
    top 2, a shared expert), batch 4, sequence 128-256, AdamW; the experts' loads vary with the
    router."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(
        vocab_size=8000,
        hidden_size=384,
        intermediate_size=1024,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
    )
    model = Qwen2MoeForCausalLM(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return causal_lm_step(model, opt, random.Random(16), cfg.vocab_size, 4, [128, 192, 256])


def textcls_small_infer():
    """A small heap: a bag-of-embeddings text classifier (vocabulary 20000, width 128, two
    hidden layers) serving batches of 1-256 documents of 16-256 tokens."""
    emb = nn.EmbeddingBag(20000, 128, mode="mean").to(DEV)
    head = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10)).to(DEV)
    rng = random.Random(17)

    def step(i):
        for _ in range(4):
            b, n = rng.randint(1, 256), rng.randint(16, 256)
            with torch.no_grad():
                head(emb(torch.randint(0, 20000, (b, n), device=DEV))).softmax(-1)

    return step


def gptj_generate_sampling():
    """A decoder sampling text: GPT-J-style (parallel attention and MLP, rotary; 4 layers, width
    512), batch 1-8, prompts of 8-64 tokens, 32-96 new tokens, top-k sampling, a fresh cache
    per request."""
    from transformers import GPTJConfig, GPTJForCausalLM

    cfg = GPTJConfig(vocab_size=16000, n_positions=512, n_embd=512, n_layer=4, n_head=8,
                     rotary_dim=32, bos_token_id=1, eos_token_id=2)
    model = GPTJForCausalLM(cfg).to(DEV).eval()
    return generate_step(model, random.Random(18), 0, cfg.vocab_size, (1, 8), (8, 64), (32, 96),
                         do_sample=True, top_k=50, pad_token_id=0)


def vit_ckpt_bf16_train():
    """A vision transformer trained with activation checkpointing under bf16 autocast: timm
    ViT-Small/16, batch 16, 224x224, each block recomputed in the backward, AdamW."""
    import timm

    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=100).to(DEV)
    model.set_grad_checkpointing(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        x = torch.randn(16, 3, 224, 224, device=DEV)
        y = torch.randint(0, 100, (16,), device=DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        step_on(opt, loss)

    return step


def mamba_train():
    """A state-space language model's training step: Mamba (2 layers, width 256, the reference
    scan, not a fused kernel), batch 2, sequence 64-128, AdamW."""
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=2, state_size=16)
    model = MambaForCausalLM(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return causal_lm_step(model, opt, random.Random(19), cfg.vocab_size, 2, [64, 96, 128])


def llama_static_cache_generate():
    """A decoder generating into a preallocated cache: LLaMA-style (4 layers, width 512, grouped
    queries), the static key/value cache of transformers, batch 1-6, prompts of 16-96 tokens,
    32-64 new tokens, greedy."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16000, hidden_size=512, intermediate_size=1408,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).to(DEV).eval()
    return generate_step(model, random.Random(20), 3, cfg.vocab_size, (1, 6), (16, 96), (32, 64),
                         cache_implementation="static", do_sample=False, pad_token_id=0)


def gpt2_large_heap_train():
    """A larger heap: a GPT-2-style decoder (12 layers, width 1024), batch 4, sequence 192-384,
    AdamW — weights, gradients and optimizer state of 1.2 GB each."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=1024, n_layer=12, n_head=16, vocab_size=32000, n_positions=512,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return causal_lm_step(model, opt, random.Random(21), cfg.vocab_size, 4, [192, 256, 384])


def fasterrcnn_infer_sizes():
    """A detector serving images of varying size: torchvision Faster R-CNN with a MobileNetV3
    backbone (320 px variant), batches of 1-4 images of sides 240-480, no gradients."""
    import torchvision

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=21
    ).to(DEV).eval()
    rng = random.Random(22)

    def step(i):
        images = [
            torch.rand(3, rng.randint(240, 480), rng.randint(240, 480), device=DEV)
            for _ in range(rng.randint(1, 4))
        ]
        with torch.no_grad():
            model(images)

    return step


def gpt2_compiled_train():
    """A compiled training step: a GPT-2-style decoder (4 layers, width 384) under
    torch.compile (Inductor plans and reuses its own buffers), batch 8, sequence 128, AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=384, n_layer=4, n_head=6, vocab_size=8000, n_positions=256,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    compiled = torch.compile(lambda ids: model(input_ids=ids, labels=ids).loss)

    def step(i):
        ids = torch.randint(0, cfg.vocab_size, (8, 128), device=DEV)
        step_on(opt, compiled(ids))

    return step


def gnn_graphs_train():
    """A graph network on graphs of varying size: 3 message-passing layers (width 256, mean of
    the neighbours by index_add_), a fresh random graph of 2,000-16,000 nodes and 8 edges a node
    each step, node classification, Adam."""

    class Layer(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.self_lin, self.nbr_lin = nn.Linear(w, w), nn.Linear(w, w)

        def forward(self, h, src, dst, deg):
            agg = torch.zeros_like(h).index_add_(0, dst, h[src]) / deg
            return F.relu(self.self_lin(h) + self.nbr_lin(agg))

    inp = nn.Linear(64, 256).to(DEV)
    layers = nn.ModuleList(Layer(256) for _ in range(3)).to(DEV)
    out = nn.Linear(256, 16).to(DEV)
    params = [*inp.parameters(), *layers.parameters(), *out.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    rng = random.Random(23)

    def step(i):
        n = rng.randint(2000, 16000)
        src = torch.randint(0, n, (8 * n,), device=DEV)
        dst = torch.randint(0, n, (8 * n,), device=DEV)
        deg = torch.bincount(dst, minlength=n).clamp(min=1).unsqueeze(1).float()
        h = inp(torch.randn(n, 64, device=DEV))
        for layer in layers:
            h = layer(h, src, dst, deg)
        step_on(opt, F.cross_entropy(out(h), torch.randint(0, 16, (n,), device=DEV)))

    return step


def ppo_small_train():
    """A reinforcement-learning loop on a tiny heap: PPO-style policy and value networks (MLPs
    of width 256 on 64 features), a rollout of 256 no-gradient forward passes over 16
    environments, then 2 epochs of minibatch updates of 512 — thousands of small requests."""
    policy = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                           nn.Linear(256, 8)).to(DEV)
    value = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1)).to(DEV)
    opt = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=3e-4)

    def step(i):
        obs, acts, logps = [], [], []
        o = torch.randn(16, 64, device=DEV)
        with torch.no_grad():
            for _ in range(256):
                dist = torch.distributions.Categorical(logits=policy(o))
                a = dist.sample()
                obs.append(o)
                acts.append(a)
                logps.append(dist.log_prob(a))
                o = torch.tanh(o + 0.1 * torch.randn_like(o))
        obs, acts, logps = torch.cat(obs), torch.cat(acts), torch.cat(logps)
        adv = torch.randn(obs.shape[0], device=DEV)
        ret = torch.randn(obs.shape[0], device=DEV)
        for _ in range(2):
            for idx in torch.randperm(obs.shape[0], device=DEV).split(512):
                dist = torch.distributions.Categorical(logits=policy(obs[idx]))
                ratio = (dist.log_prob(acts[idx]) - logps[idx]).exp()
                clipped = torch.min(ratio * adv[idx], ratio.clamp(0.8, 1.2) * adv[idx])
                loss = -clipped.mean() + F.mse_loss(value(obs[idx]).squeeze(1), ret[idx])
                step_on(opt, loss - 0.01 * dist.entropy().mean())

    return step


def dit_sample():
    """A diffusion transformer sampling: 6 blocks of width 384 conditioned by adaptive layer
    norm on the timestep, latents 4x32x32 in 2x2 patches (256 tokens), batch 4 doubled for
    classifier-free guidance, 10 denoising steps carrying the latents, no gradients."""

    class Block(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.attn = nn.MultiheadAttention(w, 6, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w))
            self.ada = nn.Linear(w, 4 * w)
            self.n1 = nn.LayerNorm(w, elementwise_affine=False)
            self.n2 = nn.LayerNorm(w, elementwise_affine=False)

        def forward(self, x, c):
            s1, b1, s2, b2 = self.ada(c).unsqueeze(1).chunk(4, dim=2)
            h = self.n1(x) * (1 + s1) + b1
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.n2(x) * (1 + s2) + b2)

    w = 384
    patch_in, patch_out = nn.Linear(16, w).to(DEV), nn.Linear(w, 16).to(DEV)
    temb = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w)).to(DEV)
    blocks = nn.ModuleList(Block(w) for _ in range(6)).to(DEV).eval()
    pos = torch.randn(1, 256, w, device=DEV)
    freqs = torch.exp(-torch.arange(w // 2, device=DEV) * (9.2 / (w // 2)))

    def denoise(z, t):
        x = patch_in(z.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(-1, 256, 16))
        x = x + pos
        a = t * freqs
        c = temb(torch.cat([a.sin(), a.cos()]).expand(x.shape[0], w))
        for b in blocks:
            x = b(x, c)
        eps = patch_out(x).reshape(-1, 16, 16, 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(-1, 4, 32, 32)
        cond, uncond = eps.chunk(2)
        return uncond + 4.0 * (cond - uncond)

    def step(i):
        z = torch.randn(4, 4, 32, 32, device=DEV)
        with torch.no_grad():
            for t in torch.linspace(999, 0, 10):
                z = z - 0.1 * denoise(torch.cat([z, z]), float(t))

    return step


def speech_ctc_train():
    """A speech encoder trained with CTC on utterances of varying length: two strided 1-D
    convolutions over 80 mel features (frames / 4), 4 transformer layers of width 256, batch 8
    of 400-1600 frames, 32 output symbols, AdamW."""
    front = nn.Sequential(nn.Conv1d(80, 256, 3, stride=2, padding=1), nn.GELU(),
                          nn.Conv1d(256, 256, 3, stride=2, padding=1), nn.GELU()).to(DEV)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(DEV)
    head = nn.Linear(256, 32).to(DEV)
    opt = torch.optim.AdamW([*front.parameters(), *enc.parameters(), *head.parameters()], lr=1e-4)
    rng = random.Random(24)

    def step(i):
        frames = rng.randint(400, 1600)
        x = torch.randn(8, 80, frames, device=DEV)
        logp = head(enc(front(x).transpose(1, 2))).log_softmax(2).transpose(0, 1)
        t = logp.shape[0]
        targets = torch.randint(1, 32, (8, t // 4), device=DEV)
        loss = F.ctc_loss(logp, targets, torch.full((8,), t, dtype=torch.long),
                          torch.full((8,), t // 4, dtype=torch.long))
        step_on(opt, loss)

    return step


def gan_train():
    """A generative adversarial network: DCGAN generator and discriminator on 64x64 images (width
    64), batch 32; each step a discriminator update on real and generated images, then a
    generator update through the discriminator — two optimizers, two phases of different
    shapes."""
    nz, w = 100, 64
    g = nn.Sequential(
        nn.ConvTranspose2d(nz, w * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(w * 8), nn.ReLU(),
        nn.ConvTranspose2d(w * 8, w * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 4), nn.ReLU(),
        nn.ConvTranspose2d(w * 4, w * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 2), nn.ReLU(),
        nn.ConvTranspose2d(w * 2, w, 4, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
        nn.ConvTranspose2d(w, 3, 4, 2, 1, bias=False), nn.Tanh()).to(DEV)
    d = nn.Sequential(
        nn.Conv2d(3, w, 4, 2, 1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(w, w * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 2), nn.LeakyReLU(0.2),
        nn.Conv2d(w * 2, w * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 4), nn.LeakyReLU(0.2),
        nn.Conv2d(w * 4, w * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(w * 8), nn.LeakyReLU(0.2),
        nn.Conv2d(w * 8, 1, 4, 1, 0, bias=False)).to(DEV)
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step(i):
        real = torch.randn(32, 3, 64, 64, device=DEV)
        fake = g(torch.randn(32, nz, 1, 1, device=DEV))
        ones, zeros = torch.ones(32, device=DEV), torch.zeros(32, device=DEV)
        loss_d = (F.binary_cross_entropy_with_logits(d(real).view(-1), ones)
                  + F.binary_cross_entropy_with_logits(d(fake.detach()).view(-1), zeros))
        step_on(opt_d, loss_d)
        step_on(opt_g, F.binary_cross_entropy_with_logits(d(fake).view(-1), ones))

    return step


def mae_pretrain():
    """Masked-autoencoder pre-training: transformers' ViT-MAE (6 encoder layers of width 384, a
    decoder of 2 layers of width 256), 128x128 images in 16x16 patches with 75% masked at
    random, batch 16, AdamW."""
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    cfg = ViTMAEConfig(
        image_size=128, patch_size=16, hidden_size=384, num_hidden_layers=6,
        num_attention_heads=6, intermediate_size=1536, decoder_hidden_size=256,
        decoder_num_hidden_layers=2, decoder_num_attention_heads=8,
        decoder_intermediate_size=1024, mask_ratio=0.75)
    model = ViTMAEForPreTraining(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        step_on(opt, model(pixel_values=torch.randn(16, 3, 128, 128, device=DEV)).loss)

    return step


def memory_transformer_train():
    """A transformer with a recurrent memory: each step reads a sequence as 4 segments of 128
    tokens, each attending to the memory the segment before left (its last layer's 128 outputs,
    detached), 4 layers of width 384, batch 8, AdamW — a block carried from segment to
    segment."""
    w, seg, vocab = 384, 128, 8000
    emb = nn.Embedding(vocab, w).to(DEV)
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(w, 6, 4 * w, batch_first=True) for _ in range(4)).to(DEV)
    head = nn.Linear(w, vocab).to(DEV)
    params = [*emb.parameters(), *layers.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step(i):
        ids = torch.randint(0, vocab, (8, 4 * seg + 1), device=DEV)
        mem = torch.zeros(8, seg, w, device=DEV)
        for k in range(4):
            x = torch.cat([mem, emb(ids[:, k * seg:(k + 1) * seg])], 1)
            for layer in layers:
                x = layer(x)
            out = x[:, seg:]
            loss = F.cross_entropy(head(out).reshape(-1, vocab),
                                   ids[:, k * seg + 1:(k + 1) * seg + 1].reshape(-1))
            step_on(opt, loss)
            mem = out.detach()

    return step


def nerf_rays_train():
    """A neural radiance field: an MLP of 8 layers of width 256 with a skip (positional encoding
    of 10 frequencies), batches of 1024-4096 rays drawn each step, 48 samples a ray, volume
    rendering by a cumulative product, Adam — sizes that change with every step."""
    enc = 3 + 3 * 2 * 10

    class Field(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([nn.Linear(enc, 256)] + [nn.Linear(256, 256) for _ in range(3)])
            self.b = nn.ModuleList([nn.Linear(256 + enc, 256)]
                                   + [nn.Linear(256, 256) for _ in range(3)])
            self.out = nn.Linear(256, 4)

        def forward(self, p):
            h = p
            for lin in self.a:
                h = F.relu(lin(h))
            h = torch.cat([h, p], -1)
            for lin in self.b:
                h = F.relu(lin(h))
            return self.out(h)

    field = Field().to(DEV)
    opt = torch.optim.Adam(field.parameters(), lr=5e-4)
    freqs = 2.0 ** torch.arange(10, device=DEV)
    rng = random.Random(31)

    def step(i):
        n = rng.randint(1024, 4096)
        o, dirs = torch.randn(n, 3, device=DEV), F.normalize(torch.randn(n, 3, device=DEV), dim=-1)
        t = torch.linspace(2.0, 6.0, 48, device=DEV).expand(n, 48)
        pts = o[:, None] + dirs[:, None] * t[..., None]
        ang = pts[..., None] * freqs
        x = torch.cat([pts, ang.sin().flatten(-2), ang.cos().flatten(-2)], -1)
        raw = field(x)
        sigma, rgb = F.relu(raw[..., 0]), torch.sigmoid(raw[..., 1:])
        alpha = 1 - torch.exp(-sigma * (4.0 / 48))
        trans = torch.cumprod(torch.cat([torch.ones(n, 1, device=DEV), 1 - alpha + 1e-10], 1), 1)
        color = ((alpha * trans[:, :-1])[..., None] * rgb).sum(1)
        step_on(opt, F.mse_loss(color, torch.rand(n, 3, device=DEV)))

    return step


def pointnet_train():
    """A point-cloud classifier: PointNet (shared MLP 3-64-128-1024 over the points, max-pooled,
    a classifier of 512-256-40), batch 16 of 512-2048 points drawn each step, Adam."""
    feat = nn.Sequential(
        nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64), nn.ReLU(),
        nn.Conv1d(64, 128, 1), nn.BatchNorm1d(128), nn.ReLU(),
        nn.Conv1d(128, 1024, 1), nn.BatchNorm1d(1024)).to(DEV)
    cls = nn.Sequential(nn.Linear(1024, 512), nn.BatchNorm1d(512), nn.ReLU(),
                        nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(),
                        nn.Linear(256, 40)).to(DEV)
    opt = torch.optim.Adam([*feat.parameters(), *cls.parameters()], lr=1e-3)
    rng = random.Random(37)

    def step(i):
        pts = torch.randn(16, 3, rng.randint(512, 2048), device=DEV)
        logits = cls(feat(pts).max(2).values)
        step_on(opt, F.cross_entropy(logits, torch.randint(0, 40, (16,), device=DEV)))

    return step


def multitask_alternate_train():
    """One encoder, two tasks in turn: a BERT encoder (6 layers, width 512) trained on sentence
    classification (batch 16, length 128) on even steps and token tagging (batch 4, length 384)
    on odd ones, each with its own head, one AdamW — steps of two shapes alternating."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                     intermediate_size=2048, vocab_size=16000)
    enc = BertModel(cfg, add_pooling_layer=False).to(DEV)
    cls, tag = nn.Linear(512, 4).to(DEV), nn.Linear(512, 17).to(DEV)
    opt = torch.optim.AdamW([*enc.parameters(), *cls.parameters(), *tag.parameters()], lr=1e-4)

    def step(i):
        if i % 2 == 0:
            ids = torch.randint(0, cfg.vocab_size, (16, 128), device=DEV)
            h = enc(input_ids=ids).last_hidden_state
            loss = F.cross_entropy(cls(h[:, 0]), torch.randint(0, 4, (16,), device=DEV))
        else:
            ids = torch.randint(0, cfg.vocab_size, (4, 384), device=DEV)
            h = enc(input_ids=ids).last_hidden_state
            loss = F.cross_entropy(tag(h).reshape(-1, 17),
                                   torch.randint(0, 17, (4 * 384,), device=DEV))
        step_on(opt, loss)

    return step


def continuous_batching_generate():
    """A server generating with continuous batching: a GPT-2-style decoder (6 layers, width 512)
    serving up to 8 sequences at once, each with its own key/value cache grown by concatenation;
    each step decodes one token for every sequence, finished ones (16-96 new tokens) leave and
    new requests (prompts of 16-128 tokens, prefilled) join — caches of every length come and go."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8000, n_positions=512)
    model = GPT2LMHeadModel(cfg).to(DEV).eval()
    rng = random.Random(41)
    live = []

    def join():
        ids = torch.randint(0, cfg.vocab_size, (1, rng.randint(16, 128)), device=DEV)
        out = model(input_ids=ids, use_cache=True)
        return [out.past_key_values, out.logits[:, -1:].argmax(-1), rng.randint(16, 96)]

    def step(i):
        with torch.no_grad():
            for _ in range(24):
                while len(live) < 8:
                    live.append(join())
                for s in live:
                    out = model(input_ids=s[1], past_key_values=s[0], use_cache=True)
                    s[0], s[1], s[2] = out.past_key_values, out.logits[:, -1:].argmax(-1), s[2] - 1
                live[:] = [s for s in live if s[2] > 0]

    return step


def moco_train():
    """Contrastive learning with a momentum encoder and a queue of negatives: a ResNet-18
    encoder and its momentum copy (torchvision), 96x96 crops, batch 32, 128-d keys, a queue of
    4096 keys updated in place each step, SGD — two encoders, one trained, one averaged."""
    import copy

    import torchvision

    q_enc = torchvision.models.resnet18(num_classes=128).to(DEV)
    k_enc = copy.deepcopy(q_enc)
    for p in k_enc.parameters():
        p.requires_grad_(False)
    queue = F.normalize(torch.randn(4096, 128, device=DEV), dim=1)
    opt = torch.optim.SGD(q_enc.parameters(), lr=0.03, momentum=0.9)
    ptr = [0]

    def step(i):
        x = torch.randn(32, 3, 96, 96, device=DEV)
        q = F.normalize(q_enc(x + 0.1 * torch.randn_like(x)), dim=1)
        with torch.no_grad():
            for pq, pk in zip(q_enc.parameters(), k_enc.parameters()):
                pk.mul_(0.999).add_(pq.detach(), alpha=0.001)
            k = F.normalize(k_enc(x + 0.1 * torch.randn_like(x)), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.t()], 1) / 0.07
        step_on(opt, F.cross_entropy(logits, torch.zeros(32, dtype=torch.long, device=DEV)))
        queue[ptr[0]:ptr[0] + 32] = k
        ptr[0] = (ptr[0] + 32) % 4096

    return step


def speculative_generate():
    """Speculative decoding: a GPT-2-style target (6 layers, width 512) generating greedily with a
    small draft model (2 layers, width 256) proposing 4 tokens at a time, which the target checks
    in one pass; both caches are cropped back to the tokens accepted. Batch 1, prompts of 16-128
    tokens, 48-96 new tokens, a fresh cache per request."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def decoder(w, n):
        cfg = GPT2Config(n_embd=w, n_layer=n, n_head=8, vocab_size=8000, n_positions=512,
                         bos_token_id=0, eos_token_id=1, pad_token_id=0)
        return GPT2LMHeadModel(cfg).to(DEV).eval()

    target, draft = decoder(512, 6), decoder(256, 2)
    draft.generation_config.num_assistant_tokens = 4
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return generate_step(target, random.Random(43), 2, 8000, (1, 1), (16, 128), (48, 96),
                         assistant_model=draft, do_sample=False, pad_token_id=0)


def maml_meta_train():
    """Meta-learning with second-order gradients: MAML on a 4-block CNN (width 32) over 28x28
    images, 4 tasks a meta-batch, each 5-way with 1 or 5 shots to adapt on and 15 queries a
    class, 3 inner SGD steps whose gradients keep their graph; each task's query loss is
    backpropagated through its inner steps as it ends, the meta-gradient summed over the tasks,
    then Adam — a small heap of many small blocks."""
    from torch.func import functional_call

    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o, track_running_stats=False),
                nn.ReLU(), nn.MaxPool2d(2)]

    net = nn.Sequential(*block(1, 32), *block(32, 32), *block(32, 32), *block(32, 32),
                        nn.Flatten(), nn.Linear(32, 5)).to(DEV)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    rng = random.Random(44)

    def step(i):
        for _ in range(4):
            shots = rng.choice([1, 5])
            xs, ys = (torch.randn(5 * shots, 1, 28, 28, device=DEV),
                      torch.arange(5, device=DEV).repeat(shots))
            xq, yq = (torch.randn(75, 1, 28, 28, device=DEV),
                      torch.arange(5, device=DEV).repeat(15))
            params = dict(net.named_parameters())
            for _ in range(3):
                inner = F.cross_entropy(functional_call(net, params, (xs,)), ys)
                grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
                params = {n: p - 0.4 * g for (n, p), g in zip(params.items(), grads)}
            (F.cross_entropy(functional_call(net, params, (xq,)), yq) / 4).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def dpsgd_train():
    """Differentially private training (DP-SGD): a gradient per example by torch.func (vmap of
    grad) for a CNN of 32-64-128 channels and a 2048-256-10 classifier on 32x32 images, each
    clipped to norm 1, summed with Gaussian noise, SGD; batches of 48-80 examples as Poisson
    sampling draws them — a copy of every weight per example each step."""
    from torch.func import functional_call, grad, vmap

    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.GroupNorm(8, 128), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2048, 256), nn.ReLU(), nn.Linear(256, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = random.Random(45)

    def loss_one(params, x, y):
        return F.cross_entropy(functional_call(model, params, (x[None],)), y[None])

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def step(i):
        n = rng.randint(48, 80)
        x = torch.randn(n, 3, 32, 32, device=DEV)
        y = torch.randint(0, 10, (n,), device=DEV)
        params = {k: p.detach() for k, p in model.named_parameters()}
        g = per_example(params, x, y)
        norms = torch.stack([v.flatten(1).norm(dim=1) for v in g.values()]).norm(dim=0)
        scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
        for (k, p) in model.named_parameters():
            s = torch.einsum("n,n...->...", scale, g[k])
            p.grad = (s + 1.0 * torch.randn_like(s)) / 64
        del g
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def video_r2plus1d_train():
    """A video classifier's training step: torchvision R(2+1)D-18 (3-D convolutions factored into
    spatial and temporal ones), batch 4 clips of 8 or 12 frames at 112x112, 400 classes, SGD with
    momentum — five-dimensional activations."""
    import torchvision

    model = torchvision.models.video.r2plus1d_18(num_classes=400).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(46)

    def step(i):
        x = torch.randn(4, 3, rng.choice([8, 12]), 112, 112, device=DEV)
        y = torch.randint(0, 400, (4,), device=DEV)
        step_on(opt, F.cross_entropy(model(x), y))

    return step


def longformer_mlm_train():
    """Long documents under sliding-window attention: Longformer (4 layers, width 512, windows of
    256 tokens, the first token attending globally), masked LM, batch 2 of 512-1536 tokens
    varying per step (padded by the model to a whole number of windows), AdamW."""
    from transformers import LongformerConfig, LongformerForMaskedLM

    cfg = LongformerConfig(vocab_size=16000, hidden_size=512, num_hidden_layers=4,
                           num_attention_heads=8, intermediate_size=2048, attention_window=256,
                           max_position_embeddings=1538, pad_token_id=1)
    model = LongformerForMaskedLM(cfg).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(47)

    def step(i):
        n = rng.randint(512, 1536)
        ids = torch.randint(4, cfg.vocab_size, (2, n), device=DEV)
        glob = torch.zeros(2, n, dtype=torch.long, device=DEV)
        glob[:, 0] = 1
        labels = torch.where(torch.rand(2, n, device=DEV) < 0.15, ids, -100)
        step_on(opt, model(input_ids=ids, global_attention_mask=glob, labels=labels).loss)

    return step


def distill_train():
    """Knowledge distillation: a frozen BERT-base-like teacher (12 layers, width 768) run without
    gradients and a 4-layer student of width 384 trained on masked LM to match the teacher's
    token distributions (KL at temperature 2) and its last hidden states (projected, MSE),
    batch 8, lengths 64-192 varying per step, AdamW over the student — two models, one frozen."""
    from transformers import BertConfig, BertForMaskedLM

    def bert(w, n):
        return BertForMaskedLM(BertConfig(vocab_size=16000, hidden_size=w, num_hidden_layers=n,
                                          num_attention_heads=w // 64, intermediate_size=4 * w))

    teacher, student = bert(768, 12).to(DEV).eval(), bert(384, 4).to(DEV)
    for p in teacher.parameters():
        p.requires_grad_(False)
    proj = nn.Linear(384, 768).to(DEV)
    opt = torch.optim.AdamW([*student.parameters(), *proj.parameters()], lr=1e-4)
    rng = random.Random(48)

    def step(i):
        ids = torch.randint(5, 16000, (8, rng.choice([64, 96, 128, 160, 192])), device=DEV)
        with torch.no_grad():
            t = teacher(input_ids=ids, output_hidden_states=True)
        s = student(input_ids=ids, output_hidden_states=True)
        kl = F.kl_div(F.log_softmax(s.logits / 2, -1), F.log_softmax(t.logits / 2, -1),
                      reduction="batchmean", log_target=True) * 4
        mse = F.mse_loss(proj(s.hidden_states[-1]), t.hidden_states[-1])
        step_on(opt, kl + mse)

    return step


def neural_ode_train():
    """A neural ODE trained through its solver: an MLP vector field (64-256-256-64) integrated
    over [0, 1] by an adaptive Bogacki-Shampine (RK23) solver written out here, every stage kept
    for backpropagation, on batches of 128-256 states; the solver's error control rejects and
    shrinks steps, so how many steps a batch takes, and so how many blocks it allocates, depends
    on the data and the weights."""
    field = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                          nn.Linear(256, 64)).to(DEV)
    head = nn.Linear(64, 10).to(DEV)
    opt = torch.optim.Adam([*field.parameters(), *head.parameters()], lr=1e-3)
    rng = random.Random(49)

    def solve(y, tol):
        t, h = 0.0, 0.1
        k1 = field(y)
        while t < 1.0 - 1e-9:
            h = min(h, 1.0 - t)
            k2 = field(y + 0.5 * h * k1)
            k3 = field(y + 0.75 * h * k2)
            y3 = y + h * (2 / 9 * k1 + 1 / 3 * k2 + 4 / 9 * k3)
            k4 = field(y3)
            err = (h * (-5 / 72 * k1 + 1 / 12 * k2 + 1 / 9 * k3 - 1 / 8 * k4)).abs().max().item()
            if err <= tol:
                t, y, k1 = t + h, y3, k4
            h *= min(4.0, max(0.2, 0.9 * (tol / max(err, 1e-12)) ** (1 / 3)))
        return y

    def step(i):
        n = rng.choice([128, 192, 256])
        y0 = torch.randn(n, 64, device=DEV) * rng.choice([0.5, 1.0, 2.0])
        labels = torch.randint(0, 10, (n,), device=DEV)
        step_on(opt, F.cross_entropy(head(solve(y0, 1e-3)), labels))

    return step


def treelstm_train():
    """A child-sum Tree-LSTM (width 256) trained on sentiment over random parse trees: each step a
    batch of 16 trees of 8-40 leaves, shaped at random, evaluated level by level (every node of a
    depth at once, children's states gathered and summed), so the graph's shape, and the sizes
    of its blocks, change with every batch."""
    w = 256
    emb = nn.Embedding(5000, w).to(DEV)
    iou = nn.Linear(2 * w, 3 * w).to(DEV)
    fx, fh = nn.Linear(w, w).to(DEV), nn.Linear(w, w).to(DEV)
    out = nn.Linear(w, 5).to(DEV)
    mods = [emb, iou, fx, fh, out]
    opt = torch.optim.Adagrad([p for m in mods for p in m.parameters()], lr=0.05)
    rng = random.Random(50)

    def random_tree(leaves):
        # Merges random neighbours until one root is left: (children, depth) per node.
        nodes = [([], 0) for _ in range(leaves)]
        tops = list(range(leaves))
        while len(tops) > 1:
            k = rng.randrange(len(tops) - 1)
            arity = min(rng.choice([2, 2, 3]), len(tops) - k)
            kids = tops[k:k + arity]
            nodes.append((kids, 1 + max(nodes[c][1] for c in kids)))
            tops[k:k + arity] = [len(nodes) - 1]
        return nodes

    def step(i):
        trees = [random_tree(rng.randint(8, 40)) for _ in range(16)]
        # One forest: node ids offset per tree; roots are each tree's last node.
        nodes, roots, base = [], [], 0
        for t in trees:
            nodes += [([c + base for c in kids], d) for kids, d in t]
            base += len(t)
            roots.append(base - 1)
        h = [None] * len(nodes)
        c = [None] * len(nodes)
        for depth in range(max(d for _, d in nodes) + 1):
            ids = [j for j, (_, d) in enumerate(nodes) if d == depth]
            x = emb(torch.randint(0, 5000, (len(ids),), device=DEV))
            if depth == 0:
                hs = torch.zeros(len(ids), w, device=DEV)
                fc = torch.zeros(len(ids), w, device=DEV)
            else:
                kid_h = [torch.stack([h[k] for k in nodes[j][0]]) for j in ids]
                kid_c = [torch.stack([c[k] for k in nodes[j][0]]) for j in ids]
                hs = torch.stack([k.sum(0) for k in kid_h])
                f = [torch.sigmoid(fx(x[n]) + fh(kh)) for n, kh in enumerate(kid_h)]
                fc = torch.stack([(fk * kc).sum(0) for fk, kc in zip(f, kid_c)])
            i_, o_, u_ = iou(torch.cat([x, hs], 1)).chunk(3, 1)
            cs = torch.sigmoid(i_) * torch.tanh(u_) + fc
            hs = torch.sigmoid(o_) * torch.tanh(cs)
            for n, j in enumerate(ids):
                h[j], c[j] = hs[n], cs[n]
        logits = out(torch.stack([h[r] for r in roots]))
        step_on(opt, F.cross_entropy(logits, torch.randint(0, 5, (16,), device=DEV)))

    return step


def curriculum_gpt_train():
    """Sequence-length warm-up: a GPT-2-like decoder (6 layers, width 512, 8 heads) trained with
    AdamW on batches of 8 whose length doubles every two steps, 64 to 512, then starts over (the
    recorder's two warm-up steps are at 64, its measured ones at 128, 256, 512, then 64): the
    program's peak rises twice, each time after the pool has laid out the shorter steps."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=8000, n_positions=512, n_embd=512, n_layer=6,
                                       n_head=8)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = [64, 64, 128, 128, 256, 256, 512, 512]

    def step(i):
        ids = torch.randint(0, 8000, (8, lengths[i % len(lengths)]), device=DEV)
        step_on(opt, model(input_ids=ids, labels=ids).loss)

    return step


def active_learning_train():
    """An active-learning round per step: a ResNet-18 (torchvision) scores an unlabelled pool of
    96 images at 64x64 without gradients, the 24 least certain are picked, and the model trains
    on them for two SGD steps — inference at a large batch and training at a small one,
    alternating."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=10).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(i):
        pool = torch.randn(96, 3, 64, 64, device=DEV)
        model.eval()
        with torch.no_grad():
            p = model(pool).softmax(-1)
        pick = (-(p * p.clamp_min(1e-9).log()).sum(-1)).topk(24).indices
        x, y = pool[pick], torch.randint(0, 10, (24,), device=DEV)
        del pool, p
        model.train()
        for _ in range(2):
            step_on(opt, F.cross_entropy(model(x), y))

    return step


def early_exit_infer():
    """Inference with early exits: a 12-layer BERT-like encoder (width 512) with a classifier after
    every layer; after each layer the rows whose prediction is most confident leave the batch, so
    the remaining batch shrinks layer by layer, differently for every batch. Batches of 16-64
    rows of 64-256 tokens."""
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(vocab_size=16000, hidden_size=512, num_hidden_layers=12,
                                num_attention_heads=8, intermediate_size=2048)).to(DEV).eval()
    exits = nn.ModuleList(nn.Linear(512, 4) for _ in range(12)).to(DEV)
    rng = random.Random(51)

    def step(i):
        ids = torch.randint(5, 16000, (rng.randint(16, 64), rng.choice([64, 128, 192, 256])),
                            device=DEV)
        with torch.no_grad():
            h = bert.embeddings(input_ids=ids)
            for layer, head in zip(bert.encoder.layer, exits):
                o = layer(h)
                h = o[0] if isinstance(o, tuple) else o
                conf = head(h[:, 0]).softmax(-1).amax(-1)
                # Random weights give no calibrated confidence: the most confident 5-40% of the
                # rows left leave, a share drawn per layer, so every batch shrinks differently.
                stay = conf < conf.quantile(rng.uniform(0.6, 0.95))
                if int(stay.sum()) < 2:
                    break
                h = h[stay]

    return step


def unet3d_train():
    """Volumetric segmentation: a 3-D U-Net (16-32-64-128 channels, two convolutions a level,
    instance norm, transposed convolutions up) on batches of 2 volumes of 48x48x48 or 64x64x64
    voxels, 4 classes, Adam — large 5-D activations at two sizes."""

    def conv(i, o):
        return nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.InstanceNorm3d(o), nn.ReLU(),
                             nn.Conv3d(o, o, 3, padding=1), nn.InstanceNorm3d(o), nn.ReLU())

    class UNet3d(nn.Module):
        def __init__(self):
            super().__init__()
            ch = [16, 32, 64, 128]
            self.down = nn.ModuleList([conv(1, 16), conv(16, 32), conv(32, 64), conv(64, 128)])
            self.up = nn.ModuleList(nn.ConvTranspose3d(ch[k + 1], ch[k], 2, stride=2)
                                    for k in range(3))
            self.merge = nn.ModuleList(conv(2 * ch[k], ch[k]) for k in range(3))
            self.out = nn.Conv3d(16, 4, 1)

        def forward(self, x):
            skips = []
            for k, d in enumerate(self.down):
                x = d(x if k == 0 else F.max_pool3d(x, 2))
                skips.append(x)
            for k in reversed(range(3)):
                x = self.merge[k](torch.cat([self.up[k](x), skips[k]], 1))
            return self.out(x)

    model = UNet3d().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(52)

    def step(i):
        s = rng.choice([48, 64])
        x = torch.randn(2, 1, s, s, s, device=DEV)
        y = torch.randint(0, 4, (2, s, s, s), device=DEV)
        step_on(opt, F.cross_entropy(model(x), y))

    return step


def dlrm_sparse_train():
    """A recommendation model with sparse gradients: DLRM-style, 8 embedding bags (4k-60k rows of
    width 64, sparse gradients, SparseAdam) pooled over bags of 1-20 ids, a bottom MLP over 13
    dense features, pairwise dot interactions, a top MLP (Adam); batches of 256-2048 rows. The
    embeddings' gradients are sparse: their index and value blocks change size with every batch."""
    rows = [4000, 60000, 12000, 30000, 8000, 50000, 20000, 6000]

    class Dlrm(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.ModuleList(nn.EmbeddingBag(n, 64, mode="sum", sparse=True) for n in rows)
            self.bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU())
            k = len(rows) + 1
            self.top = nn.Sequential(nn.Linear(64 + k * (k - 1) // 2, 512), nn.ReLU(),
                                     nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

        def forward(self, dense, bags):
            z = [self.bottom(dense)] + [e(ids, offs) for e, (ids, offs) in zip(self.emb, bags)]
            t = torch.stack(z, 1)
            dots = t @ t.transpose(1, 2)
            i, j = torch.triu_indices(t.shape[1], t.shape[1], 1)
            return self.top(torch.cat([z[0], dots[:, i, j]], 1)).squeeze(1)

    model = Dlrm().to(DEV)
    sparse = list(model.emb.parameters())
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt_s = torch.optim.SparseAdam(sparse, lr=1e-3)
    opt_d = torch.optim.Adam(dense_params, lr=1e-3)
    rng = random.Random(61)

    def step(i):
        b = rng.choice([256, 512, 1024, 2048])
        bags = []
        for n in rows:
            lens = torch.randint(1, 21, (b,))
            offs = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]]).to(DEV)
            bags.append((torch.randint(0, n, (int(lens.sum()),), device=DEV), offs))
        y = torch.randint(0, 2, (b,), device=DEV).float()
        loss = F.binary_cross_entropy_with_logits(model(torch.randn(b, 13, device=DEV), bags), y)
        loss.backward()
        opt_s.step()
        opt_d.step()
        opt_s.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)

    return step


def perceiver_train():
    """Cross-attention onto a fixed latent array: Perceiver-style, 128 latents of width 256 read
    inputs of 512-4096 tokens (width 128) through one cross-attention, then 4 latent
    self-attention blocks, classification, AdamW: the inputs' size changes every step, the
    latents' never."""

    class Perceiver(nn.Module):
        def __init__(self):
            super().__init__()
            self.latents = nn.Parameter(torch.randn(128, 256) * 0.02)
            self.inp = nn.Linear(128, 256)
            self.cross = nn.MultiheadAttention(256, 4, batch_first=True)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True, dropout=0.0)
                for _ in range(4))
            self.head = nn.Linear(256, 10)

        def forward(self, x):
            kv = self.inp(x)
            q = self.latents.expand(x.shape[0], -1, -1)
            h = q + self.cross(q, kv, kv, need_weights=False)[0]
            for blk in self.blocks:
                h = blk(h)
            return self.head(h.mean(1))

    model = Perceiver().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(62)

    def step(i):
        x = torch.randn(4, rng.choice([512, 1024, 2048, 3072, 4096]), 128, device=DEV)
        step_on(opt, F.cross_entropy(model(x), torch.randint(0, 10, (4,), device=DEV)))

    return step


def tacotron_decode():
    """An autoregressive frame decoder: Tacotron-style, an LSTM decoder (width 512) with
    location-sensitive attention over encoder states of 50-200 characters (a 3-layer 1-D
    convolution and a bidirectional LSTM, width 256) emits 80-channel frames, 2 a step, for
    100-400 steps, without gradients; the frames emitted so far are concatenated into one
    tensor at every step, as a naive decoder does, so a block one frame larger replaces the
    last at each step."""

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 256)
            self.convs = nn.Sequential(*[nn.Sequential(nn.Conv1d(256, 256, 5, padding=2),
                                                       nn.BatchNorm1d(256), nn.ReLU())
                                         for _ in range(3)])
            self.enc = nn.LSTM(256, 128, batch_first=True, bidirectional=True)
            self.prenet = nn.Sequential(nn.Linear(160, 256), nn.ReLU(), nn.Linear(256, 256))
            self.att_rnn = nn.LSTMCell(256 + 256, 512)
            self.dec_rnn = nn.LSTMCell(512 + 256, 512)
            self.query = nn.Linear(512, 128, bias=False)
            self.memory = nn.Linear(256, 128, bias=False)
            self.loc_conv = nn.Conv1d(2, 32, 31, padding=15, bias=False)
            self.loc = nn.Linear(32, 128, bias=False)
            self.v = nn.Linear(128, 1, bias=False)
            self.proj = nn.Linear(512 + 256, 160)

    model = Decoder().to(DEV).eval()
    rng = random.Random(63)

    def step(i):
        b, n, t = 4, rng.randint(50, 200), rng.randint(100, 400)
        m = model
        with torch.no_grad():
            x = m.convs(m.emb(torch.randint(0, 64, (b, n), device=DEV)).transpose(1, 2))
            enc = m.enc(x.transpose(1, 2))[0]
            keys = m.memory(enc)
            ha = ca = hd = cd = torch.zeros(b, 512, device=DEV)
            ctx = torch.zeros(b, 256, device=DEV)
            w = cum = torch.zeros(b, n, device=DEV)
            frame = torch.zeros(b, 160, device=DEV)
            out = torch.zeros(b, 0, 160, device=DEV)
            for _ in range(t):
                ha, ca = m.att_rnn(torch.cat([m.prenet(frame), ctx], 1), (ha, ca))
                loc = m.loc(m.loc_conv(torch.stack([w, cum], 1)).transpose(1, 2))
                e = m.v(torch.tanh(m.query(ha).unsqueeze(1) + keys + loc)).squeeze(2)
                w = e.softmax(1)
                cum = cum + w
                ctx = (w.unsqueeze(2) * enc).sum(1)
                hd, cd = m.dec_rnn(torch.cat([ha, ctx], 1), (hd, cd))
                frame = m.proj(torch.cat([hd, ctx], 1))
                out = torch.cat([out, frame.unsqueeze(1)], 1)

    return step


def capsule_train():
    """Capsules with dynamic routing: a CapsNet (a 9x9 convolution of 128 channels, 32x8-D primary
    capsules, 10 16-D digit capsules, 3 routing iterations, a reconstruction decoder) on 28x28
    images in batches of 16-96, Adam: the routing's coupling coefficients and votes, of the
    batch's size, are made anew in each iteration."""

    def squash(s, dim=-1):
        n2 = (s * s).sum(dim, keepdim=True)
        return n2 / (1 + n2) * s / (n2.sqrt() + 1e-8)

    class CapsNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 128, 9)
            self.primary = nn.Conv2d(128, 32 * 8, 9, stride=2)
            self.w = nn.Parameter(torch.randn(1, 32 * 6 * 6, 10, 16, 8) * 0.01)
            self.decoder = nn.Sequential(nn.Linear(160, 512), nn.ReLU(), nn.Linear(512, 1024),
                                         nn.ReLU(), nn.Linear(1024, 784), nn.Sigmoid())

        def forward(self, x, y):
            u = self.primary(F.relu(self.conv(x)))
            u = squash(u.view(x.shape[0], 32, 8, 6, 6).permute(0, 1, 3, 4, 2).reshape(
                x.shape[0], -1, 8))
            votes = (self.w @ u[:, :, None, :, None]).squeeze(-1)  # b, 1152, 10, 16
            logits = torch.zeros(votes.shape[:3], device=x.device)
            for it in range(3):
                c = logits.softmax(2)
                v = squash((c.unsqueeze(-1) * votes).sum(1))
                if it < 2:
                    logits = logits + (votes * v.unsqueeze(1)).sum(-1)
            lengths = v.norm(dim=-1)
            onehot = F.one_hot(y, 10).float()
            margin = (onehot * F.relu(0.9 - lengths) ** 2
                      + 0.5 * (1 - onehot) * F.relu(lengths - 0.1) ** 2).sum(1).mean()
            rec = self.decoder((v * onehot.unsqueeze(-1)).flatten(1))
            return margin + 5e-4 * F.mse_loss(rec, x.flatten(1), reduction="sum") / x.shape[0]

    model = CapsNet().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(64)

    def step(i):
        b = rng.choice([16, 32, 64, 96])
        x = torch.rand(b, 1, 28, 28, device=DEV)
        step_on(opt, model(x, torch.randint(0, 10, (b,), device=DEV)))

    return step


def bilstm_crf_train():
    """A sequence tagger with a CRF: word embeddings (vocabulary 30000, width 128), a 2-layer
    bidirectional LSTM (width 256) and a linear-chain CRF over 17 tags, trained by the forward
    algorithm (a loop over the time steps of small blocks) on batches of 32 sentences padded to
    the batch's longest, 10-80 words, SGD; every step also Viterbi-decodes the batch without
    gradients."""

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(30000, 128)
            self.lstm = nn.LSTM(128, 256, num_layers=2, bidirectional=True, batch_first=True)
            self.out = nn.Linear(512, 17)
            self.trans = nn.Parameter(torch.randn(17, 17) * 0.1)

        def emissions(self, ids):
            return self.out(self.lstm(self.emb(ids))[0])

        def nll(self, em, tags, mask):
            b, t, _ = em.shape
            alpha = em[:, 0]
            score = em[:, 0].gather(1, tags[:, :1]).squeeze(1)
            for k in range(1, t):
                m = mask[:, k]
                nxt = torch.logsumexp(alpha.unsqueeze(2) + self.trans + em[:, k].unsqueeze(1), 1)
                alpha = torch.where(m.unsqueeze(1), nxt, alpha)
                s = self.trans[tags[:, k - 1], tags[:, k]] + em[:, k].gather(
                    1, tags[:, k:k + 1]).squeeze(1)
                score = score + s * m
            return (torch.logsumexp(alpha, 1) - score).mean()

        def viterbi(self, em, mask):
            best, back = em[:, 0], []
            for k in range(1, em.shape[1]):
                v, idx = (best.unsqueeze(2) + self.trans).max(1)
                best = torch.where(mask[:, k].unsqueeze(1), v + em[:, k], best)
                back.append(idx)
            path = [best.argmax(1)]
            for idx in reversed(back):
                path.append(idx.gather(1, path[-1].unsqueeze(1)).squeeze(1))
            return torch.stack(path[::-1], 1)

    model = Tagger().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(65)

    def step(i):
        lens = torch.tensor([rng.randint(10, 80) for _ in range(32)])
        t = int(lens.max())
        mask = (torch.arange(t).unsqueeze(0) < lens.unsqueeze(1)).to(DEV)
        ids = torch.randint(1, 30000, (32, t), device=DEV) * mask
        tags = torch.randint(0, 17, (32, t), device=DEV)
        em = model.emissions(ids)
        step_on(opt, model.nll(em, tags, mask))
        with torch.no_grad():
            model.viterbi(model.emissions(ids), mask)

    return step


def t5_adafactor_train():
    """An encoder-decoder trained with a factored optimizer: T5 (4+4 layers, width 384, 6 heads)
    on span-corruption-shaped pairs, inputs of 128-512 tokens and targets of 32-128, batch 8,
    transformers' Adafactor (row and column second moments in place of a full one per weight,
    update clipping, relative step sizes)."""
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.optimization import Adafactor

    cfg = T5Config(vocab_size=16000, d_model=384, d_kv=64, d_ff=1536, num_layers=4,
                   num_decoder_layers=4, num_heads=6, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(cfg).to(DEV)
    opt = Adafactor(model.parameters(), lr=None, relative_step=True, scale_parameter=True,
                    warmup_init=True)
    rng = random.Random(66)

    def step(i):
        src = torch.randint(1, 16000, (8, rng.choice([128, 256, 384, 512])), device=DEV)
        tgt = torch.randint(1, 16000, (8, rng.choice([32, 64, 96, 128])), device=DEV)
        step_on(opt, model(input_ids=src, labels=tgt).loss)

    return step


def lbfgs_train():
    """A full-batch quasi-Newton optimizer: an MLP (784-1024-1024-10) trained by torch.optim.LBFGS
    (history of 10 pairs, 8 iterations a step, strong-Wolfe line search) on batches of 2048
    rows: each iteration keeps two vectors of the whole model's size, dropping the oldest pair
    once the history is full, so blocks of one size live for ten iterations, first in, first
    out, between the activations."""
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)).to(DEV)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=8, history_size=10,
                            line_search_fn="strong_wolfe")

    def step(i):
        x = torch.randn(2048, 784, device=DEV)
        y = torch.randint(0, 10, (2048,), device=DEV)

        def closure():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)

    return step


def sam_train():
    """Sharpness-aware minimization: a ResNet-18 (torchvision, 10 classes) on 64x64 images in
    batches of 32-96, each step two forward and backward passes: the first's gradients scale a
    perturbation kept per weight (a copy of every weight's size, made mid-step), the weights are
    moved by it, the second pass's gradients drive SGD once the perturbation is taken back."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=10).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = list(model.parameters())
    rng = random.Random(71)

    def step(i):
        b = rng.choice([32, 64, 96])
        x = torch.randn(b, 3, 64, 64, device=DEV)
        y = torch.randint(0, 10, (b,), device=DEV)
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
            eps = [p.grad * (0.05 / (norm + 1e-12)) for p in params]
            for p, e in zip(params, eps):
                p.add_(e)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p, e in zip(params, eps):
                p.sub_(e)
        del eps
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def prune_topk_train():
    """Iterative magnitude pruning: a 6-layer transformer encoder (width 512) trained with AdamW
    on batches of 16 sequences of 128 tokens; every other step every weight matrix's mask is
    recomputed from a top-k of its magnitudes at a sparsity rising by 10% each time, and the
    masks multiply the weights in the forward pass: large temporaries of the model's own sizes
    (magnitudes, sort indices) made in bursts, next to masks that live until the next burst."""
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(DEV)
    head = nn.Linear(512, 512).to(DEV)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
    weights = [p for p in model.parameters() if p.dim() == 2]
    masks = [torch.ones_like(w) for w in weights]

    def step(i):
        nonlocal masks
        if i % 2 == 0:
            keep = max(0.1, 1.0 - 0.1 * (i // 2 % 9))
            with torch.no_grad():
                new = []
                for w in weights:
                    k = int(w.numel() * keep)
                    idx = w.abs().flatten().topk(k).indices
                    m = torch.zeros(w.numel(), device=DEV)
                    m[idx] = 1.0
                    new.append(m.view_as(w))
                masks = new
        with torch.no_grad():
            for w, m in zip(weights, masks):
                w.mul_(m)
        x = torch.randn(16, 128, 512, device=DEV)
        step_on(opt, F.mse_loss(head(model(x)), x))

    return step


def vqvae_train():
    """A vector-quantized autoencoder: a convolutional encoder (64x64 images to 16x16 codes of
    width 64), a codebook of 1024 entries updated by exponential moving averages, the decoder
    back, batches of 16-64 images, Adam: the distances from every position to every code (a
    block of the batch's positions x 1024) and the one-hot assignments are made each step."""

    class VqVae(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 4, 2, 1),
                                     nn.ReLU(), nn.Conv2d(128, 64, 3, 1, 1))
            self.dec = nn.Sequential(nn.ConvTranspose2d(64, 128, 4, 2, 1), nn.ReLU(),
                                     nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.ReLU(),
                                     nn.Conv2d(64, 3, 3, 1, 1))
            self.register_buffer("codes", torch.randn(1024, 64))
            self.register_buffer("count", torch.ones(1024))
            self.register_buffer("sums", self.codes.clone())

        def forward(self, x):
            z = self.enc(x).permute(0, 2, 3, 1)
            flat = z.reshape(-1, 64)
            d = (flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codes.t()
                 + self.codes.pow(2).sum(1))
            onehot = F.one_hot(d.argmin(1), 1024).float()
            q = (onehot @ self.codes).view_as(z)
            if self.training:
                with torch.no_grad():
                    self.count.mul_(0.99).add_(onehot.sum(0), alpha=0.01)
                    self.sums.mul_(0.99).add_(onehot.t() @ flat, alpha=0.01)
                    self.codes.copy_(self.sums / self.count.clamp_min(1e-5).unsqueeze(1))
            commit = F.mse_loss(z, q.detach())
            q = z + (q - z).detach()
            return self.dec(q.permute(0, 3, 1, 2)), commit

    model = VqVae().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    rng = random.Random(73)

    def step(i):
        x = torch.randn(rng.choice([16, 32, 48, 64]), 3, 64, 64, device=DEV)
        rec, commit = model(x)
        step_on(opt, F.mse_loss(rec, x) + 0.25 * commit)

    return step


def hypernet_train():
    """A hypernetwork: a task embedding (width 64) drives an MLP that generates every weight of a
    target network (784-256-256-10) for each of 4-12 tasks a step, each task's network applied
    to its own batch of 32-128 rows, Adam on the hypernetwork alone: the target's weights are
    activations, generated, used and freed task by task, with sizes that never change while the
    batches' do."""
    shapes = [(256, 784), (256,), (256, 256), (256,), (10, 256), (10,)]
    total = sum(int(torch.tensor(s).prod()) for s in shapes)

    class Hyper(nn.Module):
        def __init__(self):
            super().__init__()
            self.tasks = nn.Embedding(64, 64)
            self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
            self.out = nn.Linear(256, total)

        def forward(self, t, x):
            flat = self.out(self.body(self.tasks(t))).squeeze(0) * 0.01
            ws, k = [], 0
            for s in shapes:
                n = int(torch.tensor(s).prod())
                ws.append(flat[k:k + n].view(*s))
                k += n
            h = F.relu(F.linear(x, ws[0], ws[1]))
            h = F.relu(F.linear(h, ws[2], ws[3]))
            return F.linear(h, ws[4], ws[5])

    model = Hyper().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    rng = random.Random(74)

    def step(i):
        loss = 0
        for _ in range(rng.randint(4, 12)):
            b = rng.choice([32, 64, 128])
            t = torch.tensor([rng.randrange(64)], device=DEV)
            x = torch.randn(b, 784, device=DEV)
            loss = loss + F.cross_entropy(model(t, x), torch.randint(0, 10, (b,), device=DEV))
        step_on(opt, loss)

    return step


def opt_serve_small():
    """A server answering requests one at a time on a heap under 64 MiB: OPT (2 layers, width
    256), three requests a step, each one prompt of 16-160 tokens and 16-48 new tokens, greedy:
    each request's prefill makes its layers' keys and values among temporaries of their shape."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=2, ffn_dim=1024,
                    num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=256)
    model = OPTForCausalLM(cfg).to(DEV).eval()
    return generate_step(model, random.Random(61), 3, cfg.vocab_size, (1, 1), (16, 160), (16, 48),
                         requests=3, do_sample=False, pad_token_id=1)


def qwen2_serve_requests():
    """A server answering requests one at a time: Qwen2-style (6 layers, width 384, grouped
    queries), three requests a step, each a batch of 1-2 prompts of 32-256 tokens and 24-64 new
    tokens, nucleus sampling."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=12000, hidden_size=384, intermediate_size=1024,
                      num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
                      max_position_embeddings=512)
    model = Qwen2ForCausalLM(cfg).to(DEV).eval()
    return generate_step(model, random.Random(62), 3, cfg.vocab_size, (1, 2), (32, 256), (24, 64),
                         requests=3, do_sample=True, top_p=0.9, pad_token_id=0)


def neox_serve_long_prompts():
    """A server answering requests with long prompts and short answers: GPT-NeoX-style (6 layers,
    width 512, rotary), two requests a step, each one prompt of 128-448 tokens and 8-24 new
    tokens, greedy: the prefills dominate."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=16000, hidden_size=512, intermediate_size=2048,
                        num_hidden_layers=6, num_attention_heads=8, max_position_embeddings=512,
                        bos_token_id=0, eos_token_id=0)
    model = GPTNeoXForCausalLM(cfg).to(DEV).eval()
    return generate_step(model, random.Random(63), 3, cfg.vocab_size, (1, 1), (128, 448), (8, 24),
                         requests=2, do_sample=False, pad_token_id=0)


def wgan_gp_train():
    """A Wasserstein GAN with a gradient penalty: DCGAN-shaped critic and generator on 64x64
    images (width 64), 3 critic steps per generator step, each critic step differentiating the
    critic's gradient at interpolated images (a double backward: create_graph), batches of 32,
    Adam for both."""
    gen = nn.Sequential(
        nn.ConvTranspose2d(100, 256, 4, 1, 0), nn.BatchNorm2d(256), nn.ReLU(),
        nn.ConvTranspose2d(256, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 3, 4, 4, 0), nn.Tanh()).to(DEV)
    critic = nn.Sequential(
        nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(128, 256, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(256, 1, 8, 1, 0)).to(DEV)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))

    def step(i):
        for _ in range(3):
            real = torch.randn(32, 3, 64, 64, device=DEV)
            with torch.no_grad():
                fake = gen(torch.randn(32, 100, 1, 1, device=DEV))
            a = torch.rand(32, 1, 1, 1, device=DEV)
            mid = (a * real + (1 - a) * fake).requires_grad_(True)
            g = torch.autograd.grad(critic(mid).sum(), mid, create_graph=True)[0]
            penalty = ((g.flatten(1).norm(dim=1) - 1) ** 2).mean()
            step_on(opt_c, critic(fake).mean() - critic(real).mean() + 10 * penalty)
        step_on(opt_g, -critic(gen(torch.randn(32, 100, 1, 1, device=DEV))).mean())

    return step


def rnnt_train():
    """A speech transducer (RNN-T) trained on utterances of varying length: a 2-layer LSTM
    encoder (width 320) over 4x-subsampled features, an embedding and an LSTM as the prediction
    network over the labels, and the joint network over every (frame, label) pair: a (batch,
    frames, labels + 1, vocabulary) tensor whose size follows frames x labels, both drawn each
    step (frames 60-200, labels 8-40; batch 8, vocabulary 256). The loss sums the lattice's blank
    and label log-probabilities (a surrogate for the forward-backward); AdamW."""
    V, H = 256, 320

    class Transducer(nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = nn.Conv1d(80, H, 4, stride=4)
            self.enc = nn.LSTM(H, H, 2, batch_first=True)
            self.emb = nn.Embedding(V, H)
            self.pred = nn.LSTM(H, H, 1, batch_first=True)
            self.fe, self.fp, self.out = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, V)

        def forward(self, feats, labels):
            e, _ = self.enc(self.sub(feats).transpose(1, 2))
            p, _ = self.pred(self.emb(F.pad(labels, (1, 0))))
            joint = torch.tanh(self.fe(e).unsqueeze(2) + self.fp(p).unsqueeze(1))
            return self.out(joint).log_softmax(-1)

    model = Transducer().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(81)

    def step(i):
        b, t, u = 8, rng.randint(60, 200), rng.randint(8, 40)
        labels = torch.randint(1, V, (b, u), device=DEV)
        lp = model(torch.randn(b, 80, 4 * t, device=DEV), labels)
        on = labels[:, None, :, None].expand(b, lp.shape[1], u, 1)
        step_on(opt, -(lp[..., 0].sum() + lp[:, :, :u].gather(3, on).sum()) / (b * t))

    return step


def fno_train_sizes():
    """A Fourier neural operator trained at several resolutions: 4 spectral layers (width 32,
    the lowest 12 x 12 modes of each half-plane) on 2-D fields whose grid is drawn each step
    from 64, 96 and 128 points a side, batch 16, Adam: each layer's real FFT, the modes' complex
    products and the inverse FFT allocate complex tensors (and cuFFT's work areas) of the grid's
    size."""
    W, M = 32, 12

    class Spectral(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(torch.randn(W, W, M, M, dtype=torch.cfloat) / (W * W))
            self.w2 = nn.Parameter(torch.randn(W, W, M, M, dtype=torch.cfloat) / (W * W))
            self.skip = nn.Conv2d(W, W, 1)

        def forward(self, x):
            b, _, h, w = x.shape
            xf = torch.fft.rfft2(x)
            out = torch.zeros(b, W, h, w // 2 + 1, dtype=torch.cfloat, device=x.device)
            out[:, :, :M, :M] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :M, :M], self.w1)
            out[:, :, -M:, :M] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -M:, :M], self.w2)
            return F.gelu(torch.fft.irfft2(out, s=(h, w)) + self.skip(x))

    model = nn.Sequential(nn.Conv2d(3, W, 1), *[Spectral() for _ in range(4)],
                          nn.Conv2d(W, 1, 1)).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(82)

    def step(i):
        n = rng.choice([64, 96, 128])
        x = torch.randn(16, 3, n, n, device=DEV)
        step_on(opt, F.mse_loss(model(x), torch.randn(16, 1, n, n, device=DEV)))

    return step


def prefetch_stream_train():
    """A training loop whose input pipeline runs on a stream of its own: each batch (random
    144x144 images, cropped to 128x128 at a random place, normalised, flipped half the time,
    and its labels) is made on a side stream one step ahead of the model and handed over with
    an event and record_stream; a ResNet-18 (100 classes), batch 32, SGD with momentum:
    allocations on two streams, the side stream's freed once the main stream has used them (on
    the CPU, one stream)."""
    import contextlib

    from torchvision.models import resnet18

    model = resnet18(num_classes=100).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gpu = DEV != "cpu"
    side = torch.cuda.Stream() if gpu else None
    mean = torch.tensor([0.485, 0.456, 0.406], device=DEV).view(1, 3, 1, 1)
    rng = random.Random(83)

    def batch():
        with torch.cuda.stream(side) if gpu else contextlib.nullcontext():
            i, j = rng.randrange(17), rng.randrange(17)
            x = (torch.rand(32, 3, 144, 144, device=DEV)[:, :, i:i + 128, j:j + 128] - mean) / 0.25
            if rng.random() < 0.5:
                x = x.flip(3)
            y = torch.randint(0, 100, (32,), device=DEV)
            ready = torch.cuda.Event() if gpu else None
            if gpu:
                ready.record(side)
        return x, y, ready

    ahead = [batch()]

    def step(i):
        x, y, ready = ahead[0]
        if gpu:
            main = torch.cuda.current_stream()
            main.wait_event(ready)
            record_stream(x, main)
            record_stream(y, main)
        ahead[0] = batch()
        step_on(opt, F.cross_entropy(model(x), y))

    return step


def point_knn_train():
    """Point clouds with neighbourhoods: a DGCNN-style classifier (3 edge convolutions of width
    64, 64 and 128 over each point's 16 nearest neighbours, found among the cloud's points by
    their pairwise distances; a shared layer to 512 over the three, max-pooled; 40 classes) on
    clouds of 512-2048 points drawn each step, batch 8, Adam: the distance matrices grow with
    the square of the cloud, the neighbourhoods with its size."""
    K = 16

    def edge(x, lin):
        b, n, c = x.shape
        idx = torch.cdist(x, x).topk(K, dim=-1, largest=False).indices
        idx = idx + torch.arange(b, device=x.device).view(b, 1, 1) * n
        nb = x.reshape(b * n, c)[idx.reshape(-1)].view(b, n, K, c)
        center = x.unsqueeze(2).expand(-1, -1, K, -1)
        return lin(torch.cat([center, nb - center], -1)).amax(2)

    class Dgcnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.edges = nn.ModuleList(
                nn.Sequential(nn.Linear(2 * a, z), nn.LayerNorm(z), nn.GELU())
                for a, z in [(3, 64), (64, 64), (64, 128)])
            self.mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU())
            self.head = nn.Linear(512, 40)

        def forward(self, x):
            hs = []
            for e in self.edges:
                x = edge(x, e)
                hs.append(x)
            return self.head(self.mlp(torch.cat(hs, -1)).amax(1))

    model = Dgcnn().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(84)

    def step(i):
        x = torch.randn(8, rng.randint(512, 2048), 3, device=DEV)
        step_on(opt, F.cross_entropy(model(x), torch.randint(0, 40, (8,), device=DEV)))

    return step


def kfac_train():
    """A second-order optimiser's statistics: an MLP (512-1024-1024-1024-10) preconditioned
    K-FAC-style. Each layer's input and output-gradient covariances (up to 1024 x 1024) are kept
    as running averages, inverted every 4 steps through a symmetric eigendecomposition
    (cuSOLVER's work areas), and each gradient is multiplied by both inverses before SGD with
    momentum; batches of 128-512 rows."""
    dims = [512, 1024, 1024, 1024, 10]
    layers = [nn.Linear(a, z) for a, z in zip(dims, dims[1:])]
    model = nn.Sequential(*[m for lin in layers for m in (lin, nn.ReLU())][:-1]).to(DEV)
    acts, grads = {}, {}

    def keep(k):
        def hook(m, i, o):
            acts[k] = i[0].detach()
            o.register_hook(lambda g: grads.__setitem__(k, g.detach()))

        return hook

    for k, lin in enumerate(layers):
        lin.register_forward_hook(keep(k))
    cov_a = [torch.eye(lin.in_features, device=DEV) for lin in layers]
    cov_g = [torch.eye(lin.out_features, device=DEV) for lin in layers]
    inv = [(a.clone(), g.clone()) for a, g in zip(cov_a, cov_g)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(85)

    def inverse(m):
        w, v = torch.linalg.eigh(m)
        return (v / (w.clamp_min(0) + 1e-3)) @ v.T

    def step(i):
        b = rng.choice([128, 256, 512])
        x = torch.randn(b, 512, device=DEV)
        F.cross_entropy(model(x), torch.randint(0, 10, (b,), device=DEV)).backward()
        for k, lin in enumerate(layers):
            a, g = acts[k], grads[k]
            cov_a[k].mul_(0.95).add_(a.T @ a, alpha=0.05 / b)
            cov_g[k].mul_(0.95).add_(g.T @ g, alpha=0.05 * b)
            if i % 4 == 0:
                inv[k] = (inverse(cov_a[k]), inverse(cov_g[k]))
            lin.weight.grad = inv[k][1] @ lin.weight.grad @ inv[k][0]
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def mean_teacher_side_train():
    """Mean-teacher consistency training with the teacher on a stream of its own: a ResNet-18
    student (10 classes, batches of 24 or 32 random 96x96 images, SGD with momentum) learns
    from labels and from the soft targets of its teacher, the exponential moving average of its
    weights (no gradients). While the student trains on a batch, the teacher computes the next
    batch's targets on a side stream (its activations freed as its forward goes), handed over
    with an event and record_stream, and after the step follows the student's weights there:
    two streams that both allocate in every step, the side stream's working set a forward's
    (on the CPU, one stream)."""
    import contextlib
    import copy

    from torchvision.models import resnet18

    student = resnet18(num_classes=10).to(DEV)
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad_(False)
    s_params = list(student.parameters())
    t_params = list(teacher.parameters())
    opt = torch.optim.SGD(s_params, lr=0.01, momentum=0.9)
    gpu = DEV != "cpu"
    side = torch.cuda.Stream() if gpu else None
    rng = random.Random(89)

    def on_side():
        return torch.cuda.stream(side) if gpu else contextlib.nullcontext()

    def next_batch():
        b = rng.choice((24, 32))
        x = torch.rand(b, 3, 96, 96, device=DEV)
        y = torch.randint(0, 10, (b,), device=DEV)
        if gpu:
            side.wait_stream(torch.cuda.current_stream())
            record_stream(x, side)
        with on_side(), torch.no_grad():
            soft = teacher(x).softmax(-1)
            ready = torch.cuda.Event() if gpu else None
            if gpu:
                ready.record(side)
        return x, y, soft, ready

    ahead = [next_batch()]

    def step(i):
        x, y, soft, ready = ahead[0]
        if gpu:
            main = torch.cuda.current_stream()
            main.wait_event(ready)
            main.wait_stream(side)  # the teacher's last update read the weights this step writes
            record_stream(soft, main)
        ahead[0] = next_batch()
        logits = student(x)
        loss = F.cross_entropy(logits, y) + F.mse_loss(logits.softmax(-1), soft)
        step_on(opt, loss)
        if gpu:
            side.wait_stream(main)
        with on_side(), torch.no_grad():
            torch._foreach_mul_(t_params, 0.99)
            torch._foreach_add_(t_params, s_params, alpha=0.01)

    return step


# name: (workload, measured steps)
HOST = {
    "distilbert_cls_train": (distilbert_cls_train, 8),
    "albert_mlm_train": (albert_mlm_train, 6),
    "mobilenet_train": (mobilenet_train, 8),
    "bart_generate": (bart_generate, 4),
    "deit_infer_batches": (deit_infer_batches, 12),
    "gru_seq2seq_train": (gru_seq2seq_train, 10),
    "deeplab_train_sizes": (deeplab_train_sizes, 8),
    "qwen_moe_train": (qwen_moe_train, 8),
    "textcls_small_infer": (textcls_small_infer, 12),
    "gptj_generate_sampling": (gptj_generate_sampling, 4),
    "vit_ckpt_bf16_train": (vit_ckpt_bf16_train, 6),
    "mamba_train": (mamba_train, 4),
    "llama_static_cache_generate": (llama_static_cache_generate, 4),
    "gpt2_large_heap_train": (gpt2_large_heap_train, 4),
    "fasterrcnn_infer_sizes": (fasterrcnn_infer_sizes, 8),
    "gpt2_compiled_train": (gpt2_compiled_train, 8),
    "gnn_graphs_train": (gnn_graphs_train, 8),
    "ppo_small_train": (ppo_small_train, 4),
    "dit_sample": (dit_sample, 4),
    "speech_ctc_train": (speech_ctc_train, 8),
    "gan_train": (gan_train, 6),
    "mae_pretrain": (mae_pretrain, 6),
    "memory_transformer_train": (memory_transformer_train, 4),
    "nerf_rays_train": (nerf_rays_train, 8),
    "pointnet_train": (pointnet_train, 8),
    "multitask_alternate_train": (multitask_alternate_train, 8),
    "continuous_batching_generate": (continuous_batching_generate, 6),
    "moco_train": (moco_train, 8),
    "speculative_generate": (speculative_generate, 4),
    "maml_meta_train": (maml_meta_train, 6),
    "dpsgd_train": (dpsgd_train, 24),
    "video_r2plus1d_train": (video_r2plus1d_train, 4),
    "longformer_mlm_train": (longformer_mlm_train, 4),
    "distill_train": (distill_train, 6),
    "neural_ode_train": (neural_ode_train, 8),
    "treelstm_train": (treelstm_train, 8),
    "curriculum_gpt_train": (curriculum_gpt_train, 8),
    "active_learning_train": (active_learning_train, 6),
    "early_exit_infer": (early_exit_infer, 12),
    "unet3d_train": (unet3d_train, 6),
    "dlrm_sparse_train": (dlrm_sparse_train, 8),
    "perceiver_train": (perceiver_train, 8),
    "tacotron_decode": (tacotron_decode, 4),
    "capsule_train": (capsule_train, 8),
    "bilstm_crf_train": (bilstm_crf_train, 8),
    "t5_adafactor_train": (t5_adafactor_train, 6),
    "lbfgs_train": (lbfgs_train, 6),
    "sam_train": (sam_train, 6),
    "prune_topk_train": (prune_topk_train, 8),
    "vqvae_train": (vqvae_train, 8),
    "hypernet_train": (hypernet_train, 8),
    "wgan_gp_train": (wgan_gp_train, 4),
    "opt_serve_small": (opt_serve_small, 4),
    "qwen2_serve_requests": (qwen2_serve_requests, 4),
    "neox_serve_long_prompts": (neox_serve_long_prompts, 4),
    "rnnt_train": (rnnt_train, 8),
    "fno_train_sizes": (fno_train_sizes, 8),
    "prefetch_stream_train": (prefetch_stream_train, 8),
    "point_knn_train": (point_knn_train, 8),
    "kfac_train": (kfac_train, 12),
    "mean_teacher_side_train": (mean_teacher_side_train, 8),
}

# Sessions 57's and 58's programs, in modules of their own (they read DEV and step_on from this one).
from host_workloads_phased import PHASED  # noqa: E402
from host_workloads_inner import INNER  # noqa: E402

HOST.update(PHASED)
HOST.update(INNER)
