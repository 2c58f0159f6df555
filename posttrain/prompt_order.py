"""A prompt order for TRL's GRPO trainers that a resumed run repeats step for step.

TRL's ``RepeatSampler`` seeds its generator once and draws one permutation per pass over the prompts, so epoch e's
order depended on the passes this process had made; transformers resumes at the checkpoint's epoch without
replaying the earlier ones, so a run resumed in epoch e >= 1 replayed epoch 0's prompts. ``EpochSampler`` shuffles
pass e as a function of (seed, e) alone, and ``EpochOrderedPrompts`` puts it under a GRPOTrainer subclass.

Example:
    >>> sampler = EpochSampler(range(4), mini_repeat_count=2, batch_size=2, seed=0)
    >>> sampler.set_epoch(1)
    >>> len(list(sampler))                                   # 4 prompts, each twice (one per response)
    8
"""
from __future__ import annotations

import inspect

import torch
from trl.trainer.utils import RepeatSampler


class EpochSampler(RepeatSampler):
    """``RepeatSampler`` whose pass ``e`` (``set_epoch``) reseeds and discards e permutations first: the orders an
    uninterrupted RepeatSampler draws, every epoch, at a cost of e permutations of the prompt indices."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0
        self.base_seed = self.generator.initial_seed() if self.shuffle else None  # seed=None: torch's default seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            self.generator.manual_seed(self.base_seed)
            for _ in range(self.epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        self.epoch += 1  # a pass no one numbered is the next one, as with RepeatSampler
        yield from super().__iter__()


class EpochOrderedPrompts:
    """Mixin for a ``GRPOTrainer`` subclass (list it first): TRL's sampler as an ``EpochSampler``."""

    _prompt_sampler: EpochSampler | None = None

    def _get_train_sampler(self, dataset=None) -> EpochSampler:
        base = super()._get_train_sampler(dataset)
        self._prompt_sampler = EpochSampler(base.data_source, base.mini_repeat_count, base.batch_size,
                                            base.repeat_count, base.shuffle, base.seed)
        return self._prompt_sampler

    def _run_epoch(self, *args, **kwargs):
        # accelerate passes set_epoch on to the sampler, except on a multi-process launch resumed mid-epoch (the
        # skipping batch sampler wraps the sharding one, and neither forwards it): number the pass here as well
        if self._prompt_sampler is not None:
            epoch = inspect.signature(super()._run_epoch).bind(*args, **kwargs).arguments["epoch"]
            self._prompt_sampler.set_epoch(epoch)
        return super()._run_epoch(*args, **kwargs)
