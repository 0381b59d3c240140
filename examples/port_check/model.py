"""The Python original that port_check.cpp ports to C++, and its training
loop: a Conv1d stem with BatchNorm, one pre-norm transformer block
(attention written out, a GELU MLP), a mean-pooled linear head, trained
with AdamW, gradient clipping and a cosine learning-rate schedule: the
kind of model whose faithful C++ port does not agree bit for bit, because
LibTorch's C++ AdamW rounds differently from Python's from the second
update (Python's exp_avg.lerp_ against C++'s mul_ and add_), and Adam
turns rounding noise into steps.

PyTorch's defaults throughout: nn.LayerNorm's eps 1e-5, nn.GELU() exact,
nn.BatchNorm1d's momentum 0.1, AdamW's betas (0.9, 0.999), eps 1e-8.
"""

import math

import torch

STEPS = 30
BATCH, CHANNELS, LENGTH, WIDTH, OUT = 8, 4, 12, 16, 3
LR, WEIGHT_DECAY, CLIP = 3e-3, 0.01, 1.0
# The steps recorded: every one at first, then every fifth (as C++'s
# Options::steps): a bug shows at its first step, drift shows later.
RECORDED = [0, 1, 2, 3, 4, 9, 14, 19, 24, 29]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(CHANNELS, WIDTH, 3, padding=1)
        self.bn = torch.nn.BatchNorm1d(WIDTH)
        self.ln1 = torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)
        self.ln2 = torch.nn.LayerNorm(WIDTH)
        self.fc1 = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(2 * WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, OUT)

    def forward(self, x):
        h = self.bn(self.conv(x)).transpose(1, 2)  # [batch, length, width]
        q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(WIDTH), dim=-1)
        h = h + self.proj(attn @ v)
        h = h + self.fc2(self.act(self.fc1(self.ln2(h))))
        return self.head(h.mean(dim=1))


def batch(step):
    """The step's inputs and targets: a deterministic function of the step
    (sines of a ramp, computed in float64), the same formula as the C++
    port's, so both sides train on the same bytes."""
    def wave(n, cols, phase):
        t = torch.arange(n * cols, dtype=torch.float64).reshape(n, cols)
        return torch.sin(t * 0.37 + phase + step).to(torch.float32)
    x = wave(BATCH, CHANNELS * LENGTH, 0.0).reshape(BATCH, CHANNELS, LENGTH)
    y = wave(BATCH, OUT, 1.5)
    return x, y


def lr_at(step):
    """Cosine schedule, in float64 as the C++ port computes it."""
    return LR * 0.5 * (1.0 + math.cos(math.pi * step / STEPS))


def train(model, rec):
    """The training loop both sides run, recorded by `rec` (the twin)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    for step in range(STEPS):
        rec.step(step)
        x, y = batch(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        rec.capture("lr", torch.tensor(lr_at(step), dtype=torch.float64))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        rec.capture("loss", loss)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        rec.record_grads(opt)  # the clipped gradients, as AdamW applies them
        opt.step()
