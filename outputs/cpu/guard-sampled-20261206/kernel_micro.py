import time, torch
from workbook.vllm import env as wb_env
from workbook.core.config import RunConfig
wb_env.prepare_process(RunConfig())
from workbook.hooks import guard
from workbook.hooks.guard_kernel import TakeBack
n, k1, vocab = 4, 5, 4096
end = [3]
def one():
    sampled = torch.randint(10, 100, (n, k1))
    sampled[:, 2] = 3  # an end token (not forced) in every row: the take-back looks at it
    ns = torch.full((n,), k1, dtype=torch.int32); nr = torch.zeros(n, dtype=torch.int32)
    budget = torch.full((n,), -1, dtype=torch.int32); budget[:2] = 50
    count = torch.full((n,), -1, dtype=torch.int32); count[:2] = 3
    tail = torch.full((n, 1), -1, dtype=torch.int32)
    logits = torch.randn(n * k1, vocab)
    pre = logits[:, end].clone()
    tb = TakeBack(logits, pre, torch.arange(0, n * k1 + 1, k1, dtype=torch.int32))
    guard.launch_guard_kernel(sampled, ns, nr, torch.arange(n, dtype=torch.int32), budget, count, tail,
                              torch.zeros(n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                              torch.tensor([1]), torch.tensor([3]), torch.tensor(end), take_back=tb,
                              greedy=torch.ones(n, dtype=torch.int32))
one()
ts = []
for r in range(30):
    t = time.perf_counter(); one(); ts.append(time.perf_counter() - t)
ts.sort(); print("median ms per launch", round(ts[len(ts)//2]*1e3, 2))
