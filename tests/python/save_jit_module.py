"""Saves a TorchScript module scripted in Python (torch.jit.script, then
save), for test_hooks.cpp's "[jit_saved]" case: what a user fine-tuning a
scripted model in C++ loads with torch::jit::load.

    python3 tests/python/save_jit_module.py OUT.pt
"""
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 4)
        self.out = torch.nn.Linear(4, 2)
        self.register_buffer("scale", torch.full((1,), 2.0))

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)) * self.scale)


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(Net()).save(sys.argv[1])
    print(f"save_jit_module: torch {torch.__version__}, {sys.argv[1]}")
