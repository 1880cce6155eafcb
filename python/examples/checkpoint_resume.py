"""Checkpoint and resume a training loop over a sluice service, with torch.

A linear model learns y = 3x + 1 from a distributed_epoch pipeline
(Range(1024).map(...) on the service's worker, batched here). One run
trains straight through. The other saves the model, the optimizer and the
data position together with torch.save at step 20, "crashes" (its whole
service goes away), and resumes from the file on a new service. Both end
with the same weights: the resumed run saw exactly the rest of the epoch,
in the same order (one worker reads its splits in order).

    PYTHONPATH=build/default/python /usr/bin/python3 python/examples/checkpoint_resume.py
"""

import os
import tempfile

import torch

import sluice
import sluice.torch as st
from sluice import x

sluice.set_log_level("warn")


def data(service):
    ds = (sluice.Dataset.range(1024)
          .map(x % 97)
          .distribute("distributed_epoch", service, max_outstanding_requests=4)
          .batch(16))
    return st.IterableDataset(ds)


def step(model, optim, batch):
    xb = batch.to(torch.float32).unsqueeze(1) / 97
    loss = torch.nn.functional.mse_loss(model(xb), 3 * xb + 1)
    optim.zero_grad()
    loss.backward()
    optim.step()


def fresh_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class Service:
    """A dispatcher and one worker in this process."""

    def __enter__(self):
        self.dispatcher = sluice.DispatchServer()
        self.worker = sluice.WorkerServer(dispatcher_address=self.dispatcher.address)
        return self.dispatcher.target

    def __exit__(self, *exc):
        self.worker.stop()
        self.dispatcher.stop()


# Straight through.
model, optim = fresh_model()
with Service() as service:
    steps = 0
    for batch in torch.utils.data.DataLoader(data(service), batch_size=None):
        step(model, optim, batch)
        steps += 1
uninterrupted = [p.detach().clone() for p in model.parameters()]

# Checkpoint at step 20, then everything goes away.
path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
model, optim = fresh_model()
with Service() as service:
    loader_data = data(service)
    for i, batch in enumerate(torch.utils.data.DataLoader(loader_data, batch_size=None)):
        step(model, optim, batch)
        if i + 1 == 20:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(),
                        "data": loader_data.state_dict()}, path)
            break

# A new process would start here: a new service, the checkpoint loaded.
model, optim = fresh_model()
saved = torch.load(path)
model.load_state_dict(saved["model"])
optim.load_state_dict(saved["optim"])
resumed_steps = 20
with Service() as service:
    loader_data = data(service)
    loader_data.load_state_dict(saved["data"])
    for batch in torch.utils.data.DataLoader(loader_data, batch_size=None):
        step(model, optim, batch)
        resumed_steps += 1
same = all(torch.equal(a, b) for a, b in zip(uninterrupted, model.parameters()))
print(f"steps: {steps} straight through, {resumed_steps} with a resume at step 20")
print(f"resumed model equals uninterrupted: {same}")
