"""A random Qwen3-MoE checkpoint, built offline from a config and saved as bf16 safetensors.

Also the temporary work directory it is built in (on disk, not tmpfs: file-backed experts
written there are meant to be reclaimable).
"""
import os
import tempfile


def build_checkpoint(shape, path) -> None:
    """Saves a random Qwen3-MoE of `shape` (a ModelShape, or parsed arguments with its fields) to `path`.

    Seeded (torch.manual_seed(0)) and built directly in bf16, so the dense model costs its
    bf16 size once.
    """
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=max(1, shape.hidden // 128), num_key_value_heads=max(1, shape.hidden // 512),
        head_dim=128, intermediate_size=4 * shape.hidden, moe_intermediate_size=shape.intermediate,
        num_experts=shape.experts, num_experts_per_tok=shape.top_k, decoder_sparse_step=1,
        max_position_embeddings=4096, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=None, eos_token_id=None)
    default = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cpu"):
            model = Qwen3MoeForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(path)


def make_workdir(args, prefix: str) -> str:
    """A new temporary directory under --mmap-dir (default /var/tmp: disk, not tmpfs); the caller removes it."""
    parent = args.mmap_dir or ("/var/tmp" if os.access("/var/tmp", os.W_OK) else os.getcwd())
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def checkpoint_for(args, work: str) -> str:
    """--checkpoint, or a random Qwen3-MoE of the shape in `args` built into `work`."""
    if args.checkpoint is not None:
        return args.checkpoint
    checkpoint = os.path.join(work, "checkpoint")
    print(f"building a random Qwen3-MoE model: {args.layers} layers, hidden {args.hidden}, "
          f"{args.experts} experts (top-{args.top_k}) of intermediate {args.intermediate}, "
          f"vocab {args.vocab} ...", flush=True)
    build_checkpoint(args, checkpoint)
    return checkpoint
