"""A Llama-architecture decoder in plain PyTorch (RMSNorm, rotary attention with grouped KV heads,
SwiGLU MLP, or Mixtral's routed experts), built from a config with random weights. No downloads.

PRESETS holds Hugging Face configs (the keys of config.json); scaled() shrinks one while keeping
its proportions, so the example trains tinyllama-1.1b's architecture on a laptop CPU.
"""
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 22
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_local_experts: int = 0  # > 1: Mixtral's sparse MLP
    num_experts_per_tok: int = 0

    def scaled(self, hidden_size, num_hidden_layers, vocab_size=None, max_positions=None):
        """The same architecture at hidden_size: heads keep their size ratio, the MLP its width
        ratio, the KV heads their grouping."""
        ratio = self.hidden_size // self.num_attention_heads  # head dim
        heads = max(1, hidden_size // max(16, min(ratio, hidden_size // 4)))
        group = self.num_attention_heads // self.num_key_value_heads
        kv = max(1, heads // group)
        heads = kv * max(1, heads // kv)
        inter = int(round(hidden_size * self.intermediate_size / self.hidden_size / 8)) * 8
        return replace(self, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                       num_attention_heads=heads, num_key_value_heads=kv,
                       intermediate_size=max(8, inter), vocab_size=vocab_size or self.vocab_size,
                       max_position_embeddings=max_positions or self.max_position_embeddings)


PRESETS = {
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json
    "tinyllama-1.1b": LlamaConfig(),
    # meta-llama/Llama-2-7b-hf config.json
    "llama-2-7b": LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                              max_position_embeddings=4096, rms_norm_eps=1e-5),
    # mistralai/Mixtral-8x7B-v0.1 config.json
    "mixtral-8x7b": LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                max_position_embeddings=32768, rms_norm_eps=1e-5,
                                rope_theta=1e6, num_local_experts=8, num_experts_per_tok=2),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        self.eps = eps

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x):
        # As transformers' LlamaRMSNorm: the statistics in fp32 (the same tensor when x is fp32).
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(dtype)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.heads = c.num_attention_heads
        self.kv_heads = c.num_key_value_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        kw = dict(bias=False, device=device)
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, **kw)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, **kw)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, **kw)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, **kw)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, self.head_dim, 2).float() /
                                           self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        pos = torch.arange(t, device=x.device, dtype=self.inv_freq.dtype)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.full((t, t), float("-inf"), device=x.device, dtype=scores.dtype).triu(1)
        # As transformers' eager attention: the softmax in fp32, then back to the compute dtype.
        attn = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        out = (attn @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        kw = dict(bias=False, device=device)
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, **kw)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, **kw)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, **kw)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """As transformers' MixtralSparseMoeBlock: a router sends each token to num_experts_per_tok
    experts (gated MLPs), whose outputs it weighs by its renormalised probabilities."""

    def __init__(self, c, device=None):
        super().__init__()
        self.top_k = c.num_experts_per_tok
        self.gate = nn.Linear(c.hidden_size, c.num_local_experts, bias=False, device=device)
        self.experts = nn.ModuleList(MLP(c, device) for _ in range(c.num_local_experts))

    def forward(self, x):
        b, t, h = x.shape
        x = x.reshape(-1, h)
        probs = F.softmax(self.gate(x), dim=1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        routed = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for index, expert in enumerate(self.experts):
            slot, token = torch.where(routed[index])
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(b, t, h)


class Block(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device)
        self.self_attn = Attention(c, device)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device)
        self.mlp = SparseMoE(c, device) if c.num_local_experts > 1 else MLP(c, device)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """device="meta": parameters with shapes and no memory, for strata.torch.offload to
    initialise one module at a time (param_init_fn=init_weights)."""

    def __init__(self, c, device=None):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, device=device)
        self.layers = nn.ModuleList(Block(c, device) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, device)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False, device=device)
        for m in self.modules():
            init_weights(m)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def init_weights(module):
    """The model's initialisation of one module's own parameters."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    elif isinstance(module, RMSNorm):
        module.reset_parameters()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def corpus_bytes(path=None):
    """The example corpus (examples/corpus.txt) as a uint8 tensor: a byte-level vocabulary of
    256 needs no tokenizer download."""
    import os
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")
    with open(path, "rb") as f:
        return torch.tensor(list(f.read()), dtype=torch.long)


def batches(data, steps, batch, seq, seed=0):
    """steps (inputs, targets) pairs of random windows of data, reproducible from seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        window = torch.stack([data[s:s + seq + 1] for s in starts.tolist()])
        out.append((window[:, :-1], window[:, 1:]))
    return out
