"""The Python original that port_resnet.cpp ports to C++: a small ResNet
(a conv-BN-ReLU stem, a max-pool, two BasicBlocks, the second strided with
a `downsample`, global average pooling, a linear head) trained with SGD
(momentum, Nesterov, weight decay), a MultiStepLR schedule and label
smoothing, with an evaluation pass every few steps.

A model a port check can go wrong on: its BatchNorms keep
running statistics that only the eval passes and the buffers show, its
max-pool and ReLUs make discrete choices that a one-ulp change of the
weights can flip, and it has more conventions for a port to get wrong than
layers (BatchNorm's eps and momentum, "SAME" padding, the scheduler's
place, the colour order, eval()).

Its size fits a test (16 steps on 3x8x8 inputs, batch 8, 8 and 16
channels, 4 classes, 10 of the steps recorded: 1,008 records a run): on a
larger ResNet, floor runs disagreed and faithful ports failed from step 1
on, so the first steps are where a floor is put to the test.

PyTorch's defaults throughout: BatchNorm's eps 1e-5 and momentum 0.1, its
default initialisation (torch.manual_seed(0) before the model is made).
"""

import torch

STEPS = 16
BATCH, CHANNELS, SIZE, WIDTH, CLASSES = 8, 3, 8, 8, 4
LR, MOMENTUM, WEIGHT_DECAY, LABEL_SMOOTHING = 0.05, 0.9, 1e-3, 0.1
# The learning rate is multiplied by GAMMA once these many steps are done.
MILESTONES, GAMMA = (6, 11), 0.1
# An evaluation pass follows these steps' updates.
EVAL_STEPS = (3, 7, 11, 15)
# The steps recorded: every one while the bugs show (from step 0 to the
# first milestone) and the floors are checked closely, then the evaluations'.
RECORDED = (0, 1, 2, 3, 4, 5, 6, 7, 11, 15)


class BasicBlock(torch.nn.Module):
    """torchvision's BasicBlock, by its layout: two 3x3 convs with
    BatchNorm, one ReLU module used twice (after bn1, after the residual
    add), a 1x1 strided conv and BatchNorm as `downsample` where the shape
    changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.relu = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                                  torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(CHANNELS, WIDTH, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(WIDTH)
        self.relu = torch.nn.ReLU()
        self.maxpool = torch.nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = torch.nn.Sequential(BasicBlock(WIDTH, WIDTH, 1))
        self.layer2 = torch.nn.Sequential(BasicBlock(WIDTH, 2 * WIDTH, 2))
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(2 * WIDTH, CLASSES)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def wave(n, cols, phase, step):
    """Sines of a ramp in float64, then float32: a deterministic function
    of the step that port_resnet.cpp computes with the same formula. With a
    ramp of 0.37 (port_check's), A sat on a max-pool tie at step 1 that
    every floor run broke alike, and the floor was 100 times looser from
    step 2 on (docs/diff.md); 0.29 keeps it tight."""
    t = torch.arange(n * cols, dtype=torch.float64).reshape(n, cols)
    return torch.sin(t * 0.29 + phase + step).to(torch.float32)


def batch(step):
    """The step's images (RGB, channel 0 red) and labels."""
    x = wave(BATCH, CHANNELS * SIZE * SIZE, 0.0, step).reshape(BATCH, CHANNELS, SIZE, SIZE)
    y = (torch.arange(BATCH, dtype=torch.int64) * 3 + step) % CLASSES
    return x, y


def eval_batch():
    """The evaluation batch: the same at every evaluation."""
    return batch(100)


def train(model, rec):
    """The training loop both sides run, recorded by `rec` (the twin)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(MILESTONES), gamma=GAMMA)
    xe, ye = eval_batch()
    for step in range(STEPS):
        rec.step(step)
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=LABEL_SMOOTHING)
        rec.capture("loss", loss)
        loss.backward()
        rec.record_grads(opt)
        # The rate this step's update uses.
        rec.capture("lr", torch.tensor(opt.param_groups[0]["lr"], dtype=torch.float64))
        opt.step()
        sched.step()
        if step in EVAL_STEPS:
            model.eval()
            with torch.no_grad():
                logits = model(xe)
                rec.capture("eval_logits", logits)
                rec.capture("eval_loss", torch.nn.functional.cross_entropy(logits, ye))
            model.train()
