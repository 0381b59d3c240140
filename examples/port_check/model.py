"""The Python original that port_check.cpp ports to C++: a small network,
fc2(act(norm(fc1(x)))), with PyTorch's defaults (nn.GELU() is the exact,
erf GELU; nn.LayerNorm's eps is 1e-5)."""

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))
