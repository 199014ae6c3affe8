"""Run under torchrun by test_finetune_parallel.py: one fine-tuning run through the Python API
(``zhnlp.finetune``), whole, cut short after step 7 by a callback, or resumed from the newest checkpoint.

    torchrun --nproc-per-node 2 finetune_resume_worker.py MODEL TRAIN DEV OUT whole|cut|resume
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import zhnlp  # noqa: E402


class StopAt:
    def __init__(self, step):
        self.step = step

    def on_step_end(self, config, state, control, **kw):
        if state.global_step == self.step:
            control.should_stop = True


def main(model, train, dev, out, mode):
    torch.set_num_threads(1)
    zhnlp.finetune(task="classification", model=model, train=train, dev=dev, output=out, epochs=2, batch_size=16,
                   max_length=32, lr=1e-3, dropout=0.0, warmup_ratio=0.0, log_interval=1, eval_batch_size=16,
                   save_steps=4, resume=mode == "resume", callbacks=[StopAt(7)] if mode == "cut" else None)


if __name__ == "__main__":
    main(*sys.argv[1:6])
