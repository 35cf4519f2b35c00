"""Five more programs for the host recorder (session 58), of kinds the other sets do not hold:
steps with an inner loop of their own (an attack that optimises the input before the model trains
on it; an image optimised through a frozen network), every candidate operation of a searched
architecture run side by side, a model's stochastic passes repeated to estimate its uncertainty,
and several clients' local training averaged into one model. As host_workloads.py's, they only
check the pool's rules, never choose them: models built with random weights, random data, nothing
downloaded, each function returning step(i). They read the device from host_workloads.DEV as they
build and step, so the GPU recorders' switch reaches them; host_workloads.HOST lists them after
session 57's.
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

import host_workloads as hw


def _dev():
    return hw.DEV


def pgd_adv_train():
    """Adversarial training (PGD): a ResNet-18 (10 classes) on batches of 16-32 images of 64x64;
    before each update an attack takes 3-7 signed-gradient steps on the batch's perturbation,
    each a forward and a backward to the input only (no parameter gradients), then the model
    trains on the perturbed batch: a step of several backward passes of one shape, their graphs
    freed between them, and one that makes parameter gradients."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=10).to(_dev())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(71)

    def step(i):
        b = rng.randint(16, 32)
        x = torch.rand(b, 3, 64, 64, device=_dev())
        y = torch.randint(0, 10, (b,), device=_dev())
        delta = torch.zeros_like(x).uniform_(-8 / 255, 8 / 255)
        for _ in range(rng.randint(3, 7)):
            delta.requires_grad_(True)
            loss = F.cross_entropy(model(x + delta), y)
            (g,) = torch.autograd.grad(loss, delta)
            delta = (delta.detach() + 2 / 255 * g.sign()).clamp(-8 / 255, 8 / 255)
        hw.step_on(opt, F.cross_entropy(model((x + delta).clamp(0, 1)), y))

    return step


class _MixedOp(nn.Module):
    """A DARTS edge: every candidate operation on the same input, summed by the softmax of the
    edge's architecture weights."""

    def __init__(self, c):
        super().__init__()
        self.ops = nn.ModuleList([
            nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)),
            nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 5, padding=2, groups=c, bias=False),
                          nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)),
            nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, padding=2, dilation=2, bias=False),
                          nn.BatchNorm2d(c)),
            nn.MaxPool2d(3, 1, 1),
            nn.AvgPool2d(3, 1, 1),
            nn.Identity(),
        ])

    def forward(self, x, w):
        return sum(wk * op(x) for wk, op in zip(w, self.ops))


def darts_search_train():
    """Differentiable architecture search (first-order DARTS): a network of 3 cells (16, 32, 32
    channels, 4 nodes each, every node fed by all earlier ones through a mixed edge of six
    candidate operations) on 32x32 images; each step updates the architecture weights on a
    validation batch, then the network's weights on a training batch (batches of 24-48): every
    candidate's output is kept for the backward, so the activations are several times a plain
    network's, in two backward passes of other batch sizes."""
    nodes = 4
    chans = [16, 32, 32]

    class Cell(nn.Module):
        def __init__(self, c_in, c):
            super().__init__()
            self.pre = nn.Sequential(nn.Conv2d(c_in, c, 1, bias=False), nn.BatchNorm2d(c))
            self.edges = nn.ModuleList(_MixedOp(c) for k in range(nodes) for _ in range(k + 1))

        def forward(self, x, alphas):
            states = [self.pre(x)]
            e = 0
            for k in range(nodes):
                s = 0
                for j in range(k + 1):
                    s = s + self.edges[e](states[j], F.softmax(alphas[e], -1))
                    e += 1
                states.append(s)
            return torch.cat(states[1:], 1)

    stem = nn.Conv2d(3, chans[0], 3, padding=1)
    cells = nn.ModuleList()
    c_in = chans[0]
    for c in chans:
        cells.append(Cell(c_in, c))
        c_in = c * nodes
    head = nn.Linear(c_in, 10)
    net = nn.ModuleList([stem, cells, head]).to(_dev())
    n_edges = nodes * (nodes + 1) // 2
    alphas = (1e-3 * torch.randn(len(chans), n_edges, 6, device=_dev())).requires_grad_(True)
    w_opt = torch.optim.SGD(net.parameters(), lr=0.025, momentum=0.9)
    a_opt = torch.optim.Adam([alphas], lr=3e-4)
    rng = random.Random(72)

    def forward(x):
        x = stem(x)
        for k, cell in enumerate(cells):
            x = cell(x, alphas[k])
            if k < len(cells) - 1:
                x = F.max_pool2d(x, 2)
        return head(x.mean((2, 3)))

    def batch():
        b = rng.randint(24, 48)
        return (torch.randn(b, 3, 32, 32, device=_dev()),
                torch.randint(0, 10, (b,), device=_dev()))

    def step(i):
        x, y = batch()
        a_opt.zero_grad(set_to_none=True)
        F.cross_entropy(forward(x), y).backward()
        a_opt.step()
        w_opt.zero_grad(set_to_none=True)
        x, y = batch()
        hw.step_on(w_opt, F.cross_entropy(forward(x), y))
        alphas.grad = None

    return step


def mc_dropout_infer():
    """Uncertainty by Monte Carlo dropout: a 4-layer transformer encoder classifier (width 384,
    dropout kept on) scores batches of 8-48 sequences of 32-192 tokens, 8-16 stochastic passes
    each without gradients, their softmax outputs kept pass by pass and stacked at the end for
    the mean and the variance: many passes of one shape a batch, shapes drawn anew every
    batch."""
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(384, 6, 1536, dropout=0.1, batch_first=True),
        num_layers=4).to(_dev())
    emb = nn.Embedding(10000, 384).to(_dev())
    head = nn.Linear(384, 20).to(_dev())
    enc.train()
    rng = random.Random(73)

    def step(i):
        b, n = rng.randint(8, 48), rng.randint(32, 192)
        ids = torch.randint(0, 10000, (b, n), device=_dev())
        with torch.no_grad():
            outs = []
            for _ in range(rng.randint(8, 16)):
                h = enc(F.dropout(emb(ids), 0.1, training=True))
                outs.append(F.softmax(head(h.mean(1)), -1))
            probs = torch.stack(outs)
            mean, var = probs.mean(0), probs.var(0)
            _ = (mean.argmax(-1), var.sum(-1))

    return step


def fedavg_train():
    """Federated averaging, simulated on one device: a global CNN (4 conv blocks, 64-128 channels)
    and 4-6 clients a round; each client copies the global weights into a local model, trains
    1-3 local steps with an optimizer of its own (its momentum made and dropped with it) on
    batches of 8-48 images of 48x48, and its weight delta is added to a running sum, averaged
    into the global weights at the round's end: momentum, gradients and weight deltas made and
    freed with every client, between activations of batches drawn per client."""
    def cnn():
        layers, c_in = [], 3
        for c in (64, 64, 128, 128):
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                       nn.MaxPool2d(2)]
            c_in = c
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 3 * 3, 10))

    glob = cnn().to(_dev())
    local = cnn().to(_dev())
    rng = random.Random(74)

    def step(i):
        total = [torch.zeros_like(p) for p in glob.parameters()]
        clients = rng.randint(4, 6)
        for _ in range(clients):
            local.load_state_dict(glob.state_dict())
            opt = torch.optim.SGD(local.parameters(), lr=0.05, momentum=0.9)
            for _ in range(rng.randint(1, 3)):
                b = rng.randint(8, 48)
                x = torch.randn(b, 3, 48, 48, device=_dev())
                y = torch.randint(0, 10, (b,), device=_dev())
                hw.step_on(opt, F.cross_entropy(local(x), y))
            with torch.no_grad():
                for t, p, g in zip(total, local.parameters(), glob.parameters()):
                    t.add_(p - g)
            del opt
        with torch.no_grad():
            for t, g in zip(total, glob.parameters()):
                g.add_(t / clients)

    return step


def style_transfer_train():
    """Neural style transfer: an image optimised by Adam through a frozen VGG-11's features (random
    weights, no parameter gradients), its content loss at one layer and its style loss on Gram
    matrices at four; each step a new content image (each side drawn from 128-224 pixels) and
    4-8 iterations on it: the image, its moments and its content target are made and freed with
    each image, and every iteration keeps the feature maps of the network up to its last loss
    layer for the backward."""
    import torchvision

    vgg = torchvision.models.vgg11().features.to(_dev()).eval()
    for p in vgg.parameters():
        p.requires_grad_(False)
    style_at, content_at = {1, 4, 9, 14}, 9
    rng = random.Random(75)

    def features(x):
        out = {}
        for k, layer in enumerate(vgg):
            x = layer(x)
            if k in style_at or k == content_at:
                out[k] = x
            if k >= max(style_at):
                break
        return out

    def gram(f):
        b, c, h, w = f.shape
        f = f.reshape(c, h * w)
        return f @ f.t() / (c * h * w)

    style = torch.rand(1, 3, 160, 160, device=_dev())
    with torch.no_grad():
        style_grams = {k: gram(f) for k, f in features(style).items() if k in style_at}

    def step(i):
        h, w = rng.randint(128, 224), rng.randint(128, 224)
        content = torch.rand(1, 3, h, w, device=_dev())
        with torch.no_grad():
            target = features(content)[content_at]
        img = content.clone().requires_grad_(True)
        opt = torch.optim.Adam([img], lr=0.02)
        for _ in range(rng.randint(4, 8)):
            f = features(img)
            loss = F.mse_loss(f[content_at], target)
            for k in style_at:
                loss = loss + 1e3 * F.mse_loss(gram(f[k]), style_grams[k])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return step


# name: (workload, measured steps)
INNER = {
    "pgd_adv_train": (pgd_adv_train, 4),
    "darts_search_train": (darts_search_train, 6),
    "mc_dropout_infer": (mc_dropout_infer, 6),
    "fedavg_train": (fedavg_train, 4),
    "style_transfer_train": (style_transfer_train, 6),
}
