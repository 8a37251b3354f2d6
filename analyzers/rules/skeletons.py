"""Source skeletons the rule examples fill in (a block and a transformer that walks a list of them)."""

BLOCK = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        return hidden_states + self.proj(temb)
'''


def transformer(init: str, forward: str, params: str = "hidden_states, temb") -> str:
    """BLOCK plus `class Model` with the given `__init__` body lines and `forward` body lines."""
    def body(text: str) -> str:
        return "\n".join(" " * 8 + line if line else "" for line in text.strip("\n").splitlines())

    return BLOCK + f'''

class Model(nn.Module):
    def __init__(self, layers=4):
        super().__init__()
{body(init)}

    def forward(self, {params}):
{body(forward)}
        return hidden_states
'''
