"""hoccl under Hugging Face accelerate and the transformers Trainer, at world 2 on CPU.

Each rank sets up accelerate's state on hoccl (hoccl_backend.integrations.accelerate_state), then
trains a small model with an ``Accelerator`` (model, optimizer and dataloader prepared, 3 steps)
and a tiny random-weight GPT-2 with the ``Trainer`` (3 steps). The same script on gloo, the
backend accelerate picks itself on CPU, is the reference: losses and parameters must be equal,
and on the hoccl run the process group, accelerate's state and the Trainer must really be on
hoccl. accelerate refuses hoccl by name on CPU ("Your assigned backend hoccl is not available"),
which is checked too."""
from __future__ import annotations

import pytest
import torch

from dist_utils import run_ranks

try:
    import accelerate  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:  # scripts/install.sh installs them; a bare environment may not have them
    print(f"test_accelerate: skipped, {e}")
    pytest.skip(f"accelerate and transformers are needed: {e}", allow_module_level=True)

STEPS = 3


def accelerator_steps():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    samples = 4 * STEPS * 2  # batches of 4, split over 2 ranks: STEPS steps
    data = torch.utils.data.TensorDataset(torch.randn(samples, 8, generator=g), torch.randn(samples, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean"))
    wrapped = type(model).__name__
    params = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    return {"losses": torch.stack(losses), "params": params, "wrapped": wrapped,
            "state_backend": accelerator.state.backend, "type": str(accelerator.distributed_type)}


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, count, length, vocab):
        g = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, vocab, (count, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_steps(output_dir):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(output_dir=output_dir, use_cpu=True, report_to=[], max_steps=STEPS,
                             per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1,
                             save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0,
                             accelerator_config={"use_configured_state": True})
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(16, 12, 64))
    trainer.train()
    losses = torch.tensor([h["loss"] for h in trainer.state.log_history if "loss" in h])
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()],
            "wrapped": type(trainer.model_wrapped).__name__,
            "state_backend": trainer.accelerator.state.backend, "args_backend": args.distributed_state.backend}


def train_with_accelerate(rank, world, backend, output_dir):
    import torch.distributed as dist
    from accelerate import PartialState

    if backend == "hoccl":
        from hoccl_backend.integrations import accelerate_state

        accelerate_state(cpu=True)
    else:
        PartialState(cpu=True)  # accelerate's own choice on CPU: it creates a gloo group
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    return {"backend": dist.get_backend(), "pg_type": type(pg).__name__,
            "accelerator": accelerator_steps(), "trainer": trainer_steps(f"{output_dir}/{backend}{rank}")}


def test_accelerator_and_trainer_on_hoccl_equal_gloo(tmp_path):
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ran = {b: run_ranks(train_with_accelerate, 2, b, str(tmp_path), backend=None, env=env, timeout=180)
           for b in ("hoccl", "gloo")}
    for rank in range(2):
        hoccl, gloo = ran["hoccl"][rank], ran["gloo"][rank]
        assert (hoccl["backend"], hoccl["pg_type"]) == ("hoccl", "ProcessGroupHOCCL"), hoccl
        assert (gloo["backend"], gloo["pg_type"]) == ("gloo", "ProcessGroupGloo"), gloo
        assert hoccl["accelerator"]["state_backend"] == "hoccl"
        assert hoccl["trainer"]["state_backend"] == hoccl["trainer"]["args_backend"] == "hoccl"
        for part in ("accelerator", "trainer"):
            h, g = hoccl[part], gloo[part]
            assert h["wrapped"] == g["wrapped"] == "DistributedDataParallel", (part, h["wrapped"], g["wrapped"])
            assert len(h["losses"]) == STEPS, (part, h["losses"])
            assert torch.equal(h["losses"], g["losses"]), (part, rank, h["losses"], g["losses"])
            for i, (a, b) in enumerate(zip(h["params"], g["params"])):
                assert torch.equal(a, b), (part, rank, i, (a - b).abs().max().item())
    assert torch.equal(ran["hoccl"][0]["trainer"]["params"][0], ran["hoccl"][1]["trainer"]["params"][0])


def test_accelerate_refuses_hoccl_by_name_on_cpu(monkeypatch):
    """Why accelerate_state exists: the documented way to name a backend fails for hoccl on CPU
    (accelerate checks the name before it touches torch.distributed, so no ranks are needed). If
    a release of accelerate accepts it, this fails, and the README can say so."""
    from accelerate import PartialState

    monkeypatch.setenv("WORLD_SIZE", "2")
    try:
        with pytest.raises(ValueError, match="Your assigned backend hoccl is not available, please use gloo"):
            PartialState(cpu=True, backend="hoccl")
    finally:
        PartialState._reset_state()  # the refused call leaves a half-made shared state behind


def test_accelerate_state_refuses_a_group_of_another_backend():
    import torch.distributed as dist

    from hoccl_backend.integrations import accelerate_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"already uses 'gloo', not 'hoccl'; call accelerate_state\(\) before"):
            accelerate_state()
    finally:
        dist.destroy_process_group()
