"""Workload "mlp" (shared/bench/WORKLOADS.md) from Python against the same workload in C++, in
one invocation, alternating fresh processes, medians:

  engine: pipetrain.initialize on 2 processes (`pipetrain launch -n 2`) vs the C++ engine
          (`pipetrain bench --workload mlp --skip-baseline`): samples/s and the ratio;
  gpipe:  pipetrain.GPipe {16, 16}, 8 chunks, checkpoint never and except_last, vs the C++
          GPipe of bench/gpipe_bench with the same options.

  /usr/bin/python3 bench/python_mlp_bench.py engine --repeat 5
  /usr/bin/python3 bench/python_mlp_bench.py gpipe --repeat 5

Run from the repository root after scripts/build.sh (PYTHONPATH is set to build/python here).
Prints one JSON line per measurement and a final summary line.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
WARMUP, STEPS, ROWS, MICRO = 3, 20, 256, 8
FIRST_LOSS = 0.99567413


def build_dir():
    return pathlib.Path(os.environ.get('PIPETRAIN_BUILD_DIR', ROOT / 'build'))


def workload():
    """The model's layers, x and y, in the definition's order."""
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    layers = []
    for _ in range(16):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    x, y = torch.randn(ROWS, 1024), torch.randn(ROWS, 1024)
    assert abs(layers[0].weight.sum().item() - 14.062727) < 1e-3, 'workload check value sum(W0)'
    assert abs(x.sum().item() - 684.116211) < 1e-2, 'workload check value sum(x)'
    return layers, x, y


def engine_worker():
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel
    import pipetrain  # pylint: disable=import-outside-toplevel
    from pipetrain.pipe import PipelineModule  # pylint: disable=import-outside-toplevel
    layers, x, y = workload()
    module = PipelineModule(layers=layers, num_stages=2, loss_fn=nn.MSELoss(), partition_method='uniform')
    config = {'train_batch_size': ROWS, 'train_micro_batch_size_per_gpu': ROWS // MICRO,
              'gradient_accumulation_steps': MICRO, 'steps_per_print': 10**6,
              'optimizer': {'type': 'SGD', 'params': {'lr': 0.01}}}
    engine, _, _, _ = pipetrain.initialize(model=module, config=config)
    micro = [(x[i * 32:(i + 1) * 32], y[i * 32:(i + 1) * 32]) for i in range(MICRO)]

    def data():
        while True:
            yield from micro

    it = data()
    first = engine.train_batch(it).item()
    for _ in range(WARMUP - 1):
        engine.train_batch(it)
    start = time.perf_counter()
    for _ in range(STEPS):
        last = engine.train_batch(it).item()
    elapsed = time.perf_counter() - start
    if engine.global_rank == 0:
        print(json.dumps({'system': 'pipetrain.initialize (Python)', 'samples_per_s': STEPS * ROWS / elapsed,
                          'first_loss': first, 'last_loss': last, 'threads': torch.get_num_threads()}), flush=True)


def gpipe_worker(checkpoint):
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel
    import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
    from pipetrain import GPipe  # pylint: disable=import-outside-toplevel
    cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // 2))
    layers, x, y = workload()
    # As bench/gpipe_bench.cpp runs the C++ GPipe: cores / 2 threads for each worker and the caller.
    model = GPipe(nn.Sequential(*layers), [16, 16], devices=['cpu', 'cpu'], chunks=MICRO, checkpoint=checkpoint,
                  intra_op_threads=max(1, cores // 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    first = step()
    for _ in range(WARMUP - 1):
        step()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    elapsed = time.perf_counter() - start
    print(json.dumps({'system': f'pipetrain.GPipe (Python), checkpoint={checkpoint}',
                      'samples_per_s': STEPS * ROWS / elapsed, 'first_loss': first}), flush=True)


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith('{'):
            return json.loads(line)
    raise RuntimeError(f'no JSON line in:\n{text[-3000:]}')


def run(cmd, env=None):
    full = dict(os.environ, PYTHONPATH=str(build_dir() / 'python'), **(env or {}))
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full,
                            timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f'{" ".join(map(str, cmd))} exited {result.returncode}:\n{result.stdout[-3000:]}')
    return result.stdout


def cpp_engine():
    out = last_json(run([build_dir() / 'pipetrain', 'bench', '--workload', 'mlp', '--skip-baseline', '--json']))
    return {'system': 'C++ engine', 'samples_per_s': out['samples_per_s'], 'first_loss': out.get('loss_first')}


def python_engine():
    return last_json(run([build_dir() / 'pipetrain', 'launch', '-n', '2', '--time-limit', '600', '--',
                          sys.executable, __file__, 'engine-worker']))


def cpp_gpipe(checkpoint):
    mode = {'always': 0, 'except_last': 1, 'never': 2}[checkpoint]
    report = pathlib.Path(f'/tmp/pipetrain_gpipe_bench_{os.getpid()}.json')
    run([build_dir() / 'bench' / 'gpipe_bench', f'--benchmark_filter=^BM_GPipe/{mode}/',
         f'--benchmark_out={report}', '--benchmark_out_format=json'])
    bench = json.loads(report.read_text())['benchmarks'][0]
    report.unlink()
    return {'system': f'C++ GPipe, checkpoint={checkpoint}', 'samples_per_s': bench['samples/s']}


def python_gpipe(checkpoint):
    return last_json(run([sys.executable, __file__, 'gpipe-worker', checkpoint]))


def compare(name, ours, theirs, repeat):
    a, b = [], []
    for r in range(repeat):
        for fn, sink in ((ours, a), (theirs, b)) if r % 2 == 0 else ((theirs, b), (ours, a)):
            result = fn()
            sink.append(result['samples_per_s'])
            print(json.dumps({'round': r + 1, **result}), flush=True)
    ratio = statistics.median(a) / statistics.median(b)
    summary = {'comparison': name, 'python_median': statistics.median(a), 'cpp_median': statistics.median(b),
               'ratio': ratio, 'python': a, 'cpp': b}
    print(json.dumps(summary), flush=True)
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('what', choices=['engine', 'gpipe', 'engine-worker', 'gpipe-worker'])
    parser.add_argument('checkpoint', nargs='?', default='never')
    parser.add_argument('--repeat', type=int, default=5)
    args = parser.parse_args()
    if args.what == 'engine-worker':
        engine_worker()
    elif args.what == 'gpipe-worker':
        gpipe_worker(args.checkpoint)
    elif args.what == 'engine':
        compare('pipetrain.initialize (Python) / C++ engine, mlp, 2 processes', python_engine, cpp_engine,
                args.repeat)
    else:
        for mode in ('never', 'except_last'):
            compare(f'pipetrain.GPipe (Python) / C++ GPipe, mlp {{16, 16}}, 8 chunks, checkpoint={mode}',
                    lambda m=mode: python_gpipe(m), lambda m=mode: cpp_gpipe(m), args.repeat)


if __name__ == '__main__':
    main()
