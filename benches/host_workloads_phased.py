"""Ten more programs for the host recorder (session 57), of kinds host_workloads.py does not
hold: steps made of phases with other shapes (generation, scoring and an update; crops of two
resolutions; a decoder whose output length comes from predicted durations; embeddings made without
gradients and then again with them, chunk by chunk; a large batch scored to pick a small one),
state that grows from step to step (a bank of embeddings), a variable number of micro-batches a
step, layers skipped at random, tokens merged layer by layer, and an optimizer whose state lives
in host memory. As host_workloads.py's, they only check the pool's rules, never choose them:
models built with random weights, random data, nothing downloaded, each function returning
step(i). They read the device from host_workloads.DEV as they build and step, so the GPU
recorders' switch reaches them; host_workloads.HOST lists them after its own.
"""
import copy
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

import host_workloads as hw


def _dev():
    return hw.DEV


def rlhf_ppo_train():
    """A language model tuned from a reward: each step a GPT-2-style policy (4 layers, width 256)
    samples 24-64 tokens after prompts of 16-48 (batch 4-8, its key/value cache growing), a
    frozen reference copy and a reward model (a 2-layer encoder with a scalar head) score the
    sequences without gradients, and two PPO epochs update the policy on them: three models and
    three phases of other shapes in one step."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8000, n_positions=128,
                     bos_token_id=1, eos_token_id=2)
    policy = GPT2LMHeadModel(cfg).to(_dev())
    ref = copy.deepcopy(policy).eval()
    rcfg = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                      intermediate_size=1024, vocab_size=8000, max_position_embeddings=128)
    reward = BertModel(rcfg).to(_dev()).eval()
    head = nn.Linear(256, 1).to(_dev())
    for p in [*ref.parameters(), *reward.parameters(), *head.parameters()]:
        p.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    rng = random.Random(57)

    def logprobs(model, seq, n_new):
        logits = model(input_ids=seq).logits[:, -n_new - 1:-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, seq[:, -n_new:, None]).squeeze(-1)

    def step(i):
        b, p, n = rng.randint(4, 8), rng.randint(16, 48), rng.randint(24, 64)
        prompt = torch.randint(0, 8000, (b, p), device=_dev())
        with torch.no_grad():
            seq = policy.generate(prompt, do_sample=True, min_new_tokens=n, max_new_tokens=n,
                                  pad_token_id=0)
            old = logprobs(policy, seq, n)
            kl = old - logprobs(ref, seq, n)
            score = head(reward(input_ids=seq).last_hidden_state[:, 0]).squeeze(-1)
            adv = score[:, None] - 0.1 * kl
            adv = (adv - adv.mean()) / (adv.std() + 1e-6)
        for _ in range(2):
            ratio = (logprobs(policy, seq, n) - old).exp()
            loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            hw.step_on(opt, loss)

    return step


def memory_bank_train():
    """A retrieval encoder trained against a growing bank of its past embeddings: a 2-layer
    transformer encoder (width 256) embeds 32-96 queries and their positives a step, the
    positives' embeddings (no gradients) are appended to the bank by concatenation, and the loss
    scores the queries against the whole bank; at 6144 rows the bank keeps its newest 2048. The
    bank is one block that grows by 8-24 rows a step and is copied into a larger one each time."""
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), num_layers=2).to(_dev())
    emb = nn.Embedding(5000, 256).to(_dev())
    params = [*enc.parameters(), *emb.parameters()]
    opt = torch.optim.Adam(params, lr=1e-4)
    rng = random.Random(58)
    bank = [torch.zeros(0, 256, device=_dev())]

    def embed(ids):
        return F.normalize(enc(emb(ids)).mean(1), dim=-1)

    def step(i):
        b, n = rng.randint(32, 96), rng.randint(24, 64)
        q = embed(torch.randint(0, 5000, (b, n), device=_dev()))
        with torch.no_grad():
            pos = embed(torch.randint(0, 5000, (b, n), device=_dev()))
            grown = torch.cat([bank[0], pos])
            bank[0] = grown[-2048:].clone() if grown.shape[0] > 6144 else grown
        logits = q @ bank[0].t() / 0.07
        target = torch.arange(bank[0].shape[0] - b, bank[0].shape[0], device=_dev())
        hw.step_on(opt, F.cross_entropy(logits, target))

    return step


def fastspeech_train():
    """A non-autoregressive speech synthesiser: phonemes (batch 8-16, 40-120 of them, padded)
    through a 2-layer encoder (width 256), a duration predictor, a length regulator that repeats
    each phoneme's state by its duration (1-6 frames) so the mel decoder (2 layers) runs on
    frame sequences whose length the step draws, and an L1 loss on 80 mel bins: the decoder's
    shapes follow durations, not the input's."""
    def layers():
        return nn.TransformerEncoder(
            nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), num_layers=2)

    emb = nn.Embedding(80, 256).to(_dev())
    enc, dec = layers().to(_dev()), layers().to(_dev())
    dur = nn.Sequential(nn.Conv1d(256, 256, 3, padding=1), nn.ReLU(), nn.Conv1d(256, 1, 1)).to(_dev())
    mel = nn.Linear(256, 80).to(_dev())
    params = [*emb.parameters(), *enc.parameters(), *dec.parameters(), *dur.parameters(),
              *mel.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(59)

    def step(i):
        b, n = rng.randint(8, 16), rng.randint(40, 120)
        h = enc(emb(torch.randint(0, 80, (b, n), device=_dev())))
        d = torch.randint(1, 7, (b, n), device=_dev())
        d_loss = F.mse_loss(dur(h.transpose(1, 2)).squeeze(1), d.float().log())
        frames = int(d.sum(1).max())
        rows = [h[k].repeat_interleave(d[k], dim=0) for k in range(b)]
        x = torch.stack([F.pad(r, (0, 0, 0, frames - r.shape[0])) for r in rows])
        out = mel(dec(x))
        target = torch.randn(b, frames, 80, device=_dev())
        hw.step_on(opt, F.l1_loss(out, target) + d_loss)

    return step


def packed_accum_train():
    """Sequence packing with gradient accumulation: documents of 16-300 tokens packed into rows of
    512 (a block-diagonal causal mask per row, so attention never crosses a document), rows in
    micro-batches of 4, and as many micro-batches a step as the step's 2048-4096-token budget
    needs before one AdamW step with gradient clipping: a 4-layer decoder (width 320), a step of
    one to eight backward passes into gradients that stay between them."""
    layer = nn.TransformerEncoderLayer(320, 5, 1280, batch_first=True, norm_first=True)
    body = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(_dev())
    emb = nn.Embedding(6000, 320).to(_dev())
    out = nn.Linear(320, 6000).to(_dev())
    params = [*body.parameters(), *emb.parameters(), *out.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(60)

    def packed_mask(rows, length):
        """Per row, a mask (True: blocked) that lets a token see its own document's earlier ones."""
        mask = torch.ones(rows, length, length, dtype=torch.bool, device=_dev())
        for r in range(rows):
            at = 0
            while at < length:
                n = min(rng.randint(16, 300), length - at)
                mask[r, at:at + n, at:at + n] = torch.ones(n, n, dtype=torch.bool,
                                                           device=_dev()).triu(1)
                at += n
        return mask

    def step(i):
        budget = rng.randint(2048, 4096)
        micro = max(1, budget // (4 * 512))
        for _ in range(micro):
            ids = torch.randint(0, 6000, (4, 512), device=_dev())
            mask = packed_mask(4, 512).repeat_interleave(5, dim=0)
            logits = out(body(emb(ids), mask=mask))
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, 6000), ids[:, 1:].reshape(-1))
            (loss / micro).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def dino_multicrop_train():
    """Self-distillation with multi-crop (DINO): a ViT-Tiny-style student (timm, patch 16) sees two
    global crops of 128x128 and 4-6 local crops of 64x64 a step (batch 8), its teacher (an EMA of
    its weights, no gradients) the global crops only; cross-entropy between the teacher's centred,
    sharpened outputs and the student's over every pair, then the EMA update: two resolutions,
    a varying number of crops and two copies of the network in one step."""
    import timm

    student = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=128,
                                dynamic_img_size=True, num_classes=256).to(_dev())
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad_(False)
    s_params, t_params = list(student.parameters()), list(teacher.parameters())
    opt = torch.optim.AdamW(s_params, lr=1e-4)
    center = torch.zeros(256, device=_dev())
    rng = random.Random(61)

    def step(i):
        glob = [torch.rand(8, 3, 128, 128, device=_dev()) for _ in range(2)]
        local = [torch.rand(8, 3, 64, 64, device=_dev()) for _ in range(rng.randint(4, 6))]
        with torch.no_grad():
            t_out = [((teacher(x) - center) / 0.04).softmax(-1) for x in glob]
        s_out = [F.log_softmax(student(x) / 0.1, -1) for x in glob + local]
        loss = 0
        for ti, t in enumerate(t_out):
            for si, s in enumerate(s_out):
                if si != ti:
                    loss = loss - (t * s).sum(-1).mean()
        hw.step_on(opt, loss / (len(t_out) * (len(s_out) - 1)))
        with torch.no_grad():
            center.mul_(0.9).add_(torch.cat([teacher(x) for x in glob]).mean(0), alpha=0.1)
            torch._foreach_mul_(t_params, 0.996)
            torch._foreach_add_(t_params, s_params, alpha=0.004)

    return step


def layerdrop_train():
    """Stochastic depth (LayerDrop): a 12-layer encoder (width 384) whose layers are each skipped
    with probability 0.3 in every training step, batch 16 of 128-256 tokens: the same weights
    and a step whose sequence of requests changes with the layers drawn."""
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(384, 6, 1536, batch_first=True) for _ in range(12)).to(_dev())
    emb = nn.Embedding(8000, 384).to(_dev())
    head = nn.Linear(384, 8000).to(_dev())
    params = [*layers.parameters(), *emb.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(62)

    def step(i):
        ids = torch.randint(0, 8000, (16, rng.randint(128, 256)), device=_dev())
        h = emb(ids)
        for layer in layers:
            if rng.random() >= 0.3:
                h = layer(h)
        hw.step_on(opt, F.cross_entropy(head(h).flatten(0, 1), ids.flatten()))

    return step


def gradcache_clip_train():
    """Contrastive image-text training with a gradient cache: a batch of 256 pairs too large for
    one pass is embedded in chunks of 32-64 without gradients (a ResNet-18 and a 2-layer text
    encoder, width 256), the contrastive loss over all 256 gives each embedding's gradient, and
    each chunk is embedded again with gradients and back-propagated from those: two passes of
    different shapes over the same chunks in every step."""
    from torchvision.models import resnet18

    image = resnet18(num_classes=256).to(_dev())
    text = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), num_layers=2).to(_dev())
    words = nn.Embedding(5000, 256).to(_dev())
    params = [*image.parameters(), *text.parameters(), *words.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(63)

    def embed(x, t):
        return F.normalize(image(x), dim=-1), F.normalize(text(words(t)).mean(1), dim=-1)

    def step(i):
        chunk = rng.choice([32, 64])
        xs = [torch.rand(chunk, 3, 96, 96, device=_dev()) for _ in range(256 // chunk)]
        ts = [torch.randint(0, 5000, (chunk, 32), device=_dev()) for _ in range(256 // chunk)]
        with torch.no_grad():
            zi, zt = zip(*(embed(x, t) for x, t in zip(xs, ts)))
        zi = torch.cat(zi).requires_grad_()
        zt = torch.cat(zt).requires_grad_()
        logits = zi @ zt.t() / 0.07
        target = torch.arange(256, device=_dev())
        loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2
        gi, gt = torch.autograd.grad(loss, [zi, zt])
        for k, (x, t) in enumerate(zip(xs, ts)):
            ei, et = embed(x, t)
            rows = slice(k * chunk, (k + 1) * chunk)
            ((ei * gi[rows]).sum() + (et * gt[rows]).sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def ohem_train():
    """Online hard-example mining: each step a ResNet-18 scores a candidate batch of 96-192
    images of 112x112 without gradients, keeps the 32 with the highest loss and trains on those:
    a large forward of a size the step draws, freed, then a small training step."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=100).to(_dev())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(64)

    def step(i):
        n = rng.randint(96, 192)
        x = torch.rand(n, 3, 112, 112, device=_dev())
        y = torch.randint(0, 100, (n,), device=_dev())
        with torch.no_grad():
            hard = F.cross_entropy(model(x), y, reduction="none").topk(32).indices
        hw.step_on(opt, F.cross_entropy(model(x[hard]), y[hard]))

    return step


def tome_vit_infer():
    """A vision transformer serving with token merging (ToMe): timm ViT-Small/16 on batches of
    1-32 images of 224x224, each block merging its most similar pairs of tokens (a share drawn
    per request, 8-24%) by bipartite matching before attention, so tokens shrink block by block
    and no two requests have the same shapes."""
    import timm

    model = timm.create_model("vit_small_patch16_224", pretrained=False).to(_dev()).eval()
    rng = random.Random(65)

    def merge(x, r):
        """x (batch, tokens, width) with its r most similar pairs averaged (the class token kept)."""
        cls, rest = x[:, :1], x[:, 1:]
        a, b = rest[:, ::2], rest[:, 1::2]
        score = F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).transpose(1, 2)
        best, to = score.max(-1)
        order = best.argsort(-1, descending=True)
        src, keep = order[:, :r], order[:, r:]
        w = a.shape[-1]
        b = b.scatter_reduce(1, to.gather(1, src)[..., None].expand(-1, -1, w),
                             a.gather(1, src[..., None].expand(-1, -1, w)), reduce="mean")
        return torch.cat([cls, a.gather(1, keep[..., None].expand(-1, -1, w)), b], 1)

    def step(i):
        n, share = rng.randint(1, 32), rng.uniform(0.08, 0.24)
        with torch.no_grad():
            x = model.patch_embed(torch.rand(n, 3, 224, 224, device=_dev()))
            x = model._pos_embed(x)
            for block in model.blocks:
                x = block(merge(x, int((x.shape[1] - 1) // 2 * share)))
            model.head(model.norm(x)[:, 0])

    return step


def offload_adam_train():
    """An optimizer whose state lives in host memory (ZeRO-Offload's pattern): a GPT-2-style
    decoder (6 layers, width 512), batch 8 of 128-256 tokens; after each backward every
    gradient is copied to host memory, Adam runs there on fp32 master weights, and the new
    weights are copied back into the model's: the device holds the weights, the step's
    activations and gradients, and the copies' staging, never the optimizer's moments."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8000, n_positions=256)
    model = GPT2LMHeadModel(cfg).to(_dev())
    params = [p for p in model.parameters() if p.requires_grad]
    pin = hw.DEV != "cpu"
    master = [p.detach().to("cpu", copy=True).pin_memory() if pin else p.detach().clone()
              for p in params]
    for m in master:
        m.grad = torch.zeros_like(m)
    opt = torch.optim.Adam(master, lr=1e-4)
    rng = random.Random(66)

    def step(i):
        ids = torch.randint(0, 8000, (8, rng.randint(128, 256)), device=_dev())
        model(input_ids=ids, labels=ids).loss.backward()
        for p, m in zip(params, master):
            m.grad.copy_(p.grad, non_blocking=pin)
            p.grad = None
        if pin:
            torch.cuda.current_stream().synchronize()
        opt.step()
        for p, m in zip(params, master):
            p.data.copy_(m, non_blocking=pin)

    return step


# name: (workload, measured steps)
PHASED = {
    "rlhf_ppo_train": (rlhf_ppo_train, 6),
    "memory_bank_train": (memory_bank_train, 12),
    "fastspeech_train": (fastspeech_train, 8),
    "packed_accum_train": (packed_accum_train, 6),
    "dino_multicrop_train": (dino_multicrop_train, 6),
    "layerdrop_train": (layerdrop_train, 8),
    "gradcache_clip_train": (gradcache_clip_train, 4),
    "ohem_train": (ohem_train, 8),
    "tome_vit_infer": (tome_vit_infer, 12),
    "offload_adam_train": (offload_adam_train, 6),
}
