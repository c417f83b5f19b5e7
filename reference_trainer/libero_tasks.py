"""Several LIBERO tasks under one policy: task-pinned envs, a task one-hot, suite demos.

A multi-task run pins env ``i`` to task ``tasks[i % T]`` (``T`` tasks): rebuilding the
simulator for another task costs 1-2 s, about one episode, so the envs never switch task
in training. Evaluation episode ``j`` plays task ``tasks[j % T]`` from the
``j // T``-th evaluation init state; with ``num_envs`` a multiple of ``T`` the env that
plays it (env ``j % num_envs``) is already on that task.

Needs the ``libero`` extra (the envs and the expert are imported when first used).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "TASK_ONE_HOT_KEY",
    "TaskInitStates",
    "TaskOneHot",
    "add_task_one_hot",
    "EXPERT_SUITES",
    "collect_suite_demos",
    "expert_for",
    "make_libero_env",
    "one_hot",
    "per_task_success",
    "per_task_training_success",
]

logger = logging.getLogger(__name__)

TASK_ONE_HOT_KEY = "task_one_hot"
"""Observation key of the task one-hot (float32 ``(T,)``) that `TaskOneHot` adds."""

EXPERT_SUITES = ("libero_object", "libero_spatial")
"""Suites with a scripted expert for every task (`expert_for`); libero_goal has experts
for some of its tasks (`pipelined_vec_env.libero.experts.tasks_with_experts`), usable with
``--task-ids``."""


def expert_for(suite: str, task_id: int) -> Any:
    """The scripted expert of one task: the trainer's one call into the package's experts
    (`pipelined_vec_env.libero.experts.expert_for`).

    Args:
        suite: the LIBERO suite.
        task_id: the task's index in the suite.

    Returns:
        An expert whose ``act(obs)`` maps a batch of observations (a dict with
        ``"goal_features"`` ``(n, 23)``) to actions ``(n, 7)`` float in [-1, 1].

    Raises:
        ValueError: for a task without a scripted expert (the message names the suites
            with one for every task and this suite's tasks with one), or an unknown suite.
    """
    from pipelined_vec_env.libero import experts

    if not experts.has_expert(suite, task_id):
        raise ValueError(
            f"no scripted expert for {suite} task {task_id} (tasks of {suite} with one: "
            f"{experts.tasks_with_experts(suite)}); suites with one for every task: "
            f"{', '.join(EXPERT_SUITES)}"
        )
    return experts.expert_for(suite, task_id)


def _expert_actions(experts: Sequence[Any], obs: dict[str, np.ndarray]) -> np.ndarray:
    """Env ``i``'s action from ``experts[i]``; one call for envs that share an expert."""
    groups: list[tuple[Any, list[int]]] = []
    for i, expert in enumerate(experts):
        for known, rows in groups:
            if known == expert:
                rows.append(i)
                break
        else:
            groups.append((expert, [i]))
    if len(groups) == 1:
        return np.asarray(groups[0][0].act(obs))
    actions = np.zeros((len(experts), 7), np.float32)
    for expert, rows in groups:
        actions[rows] = expert.act({k: v[rows] for k, v in obs.items()})
    return actions


class TaskInitStates(gym.Wrapper):
    """Start each training episode on one task from an init state drawn from a list.

    A reset without ``options["init_state_id"]`` goes back to ``task_id`` (an evaluation
    may have played another task on this env) from an id drawn with the env's RNG; an
    explicit ``init_state_id`` (evaluation) wins, with the options' ``task_id`` if any.

    With ``train_horizon``, training episodes truncate after that many primitive steps
    (never after the env's own horizon) and evaluation episodes (an explicit
    ``init_state_id``) after the env's own horizon (``unwrapped.horizon`` as built), so
    failed training episodes cost fewer steps while every evaluation keeps the suite's
    rule.

    Args:
        env: a `pipelined_vec_env.libero.LiberoEnv`.
        task_id: the task of training episodes; None: the env's current task.
        init_state_ids: the allowed ids (non-empty).
        train_horizon: primitive steps before a training episode truncates, at most the
            env's own horizon; None: the env's horizon for every episode.

    Raises:
        ValueError: if ``init_state_ids`` is empty, or ``train_horizon`` is not positive
            or given for an env with no ``horizon`` to set.
    """

    def __init__(
        self,
        env: gym.Env,
        task_id: int | None,
        init_state_ids: Sequence[int],
        train_horizon: int | None = None,
    ) -> None:
        super().__init__(env)
        if not init_state_ids:
            raise ValueError("init_state_ids: expected at least one id")
        if train_horizon is not None and train_horizon < 1:
            raise ValueError(f"train_horizon: expected None or an int >= 1, got {train_horizon}")
        if train_horizon is not None and not hasattr(env.unwrapped, "horizon"):
            raise ValueError("train_horizon: the env has no `horizon` (a LiberoEnv has one)")
        self.task_id = task_id
        self.init_state_ids = [int(k) for k in init_state_ids]
        self.eval_horizon = getattr(env.unwrapped, "horizon", None)  # the env's own, as built
        if train_horizon is not None and self.eval_horizon is not None:
            train_horizon = min(train_horizon, self.eval_horizon)
        self.train_horizon = train_horizon
        self._rng = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Reset to a random allowed init state of the task unless ``options`` names one."""
        options = dict(options or {})
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        training = options.get("init_state_id") is None
        if training:
            pick = int(self._rng.integers(len(self.init_state_ids)))
            options["init_state_id"] = self.init_state_ids[pick]
            if self.task_id is not None:
                options["task_id"] = self.task_id
        if self.train_horizon is not None:  # read by the env at every step
            self.env.unwrapped.horizon = self.train_horizon if training else self.eval_horizon
        return self.env.reset(seed=seed, options=options)


class TaskOneHot(gym.ObservationWrapper):
    """Add ``obs["task_one_hot"]``: 1 at the position of the env's task in ``tasks``.

    Args:
        env: a `LiberoEnv` (Dict observations; ``unwrapped.task_id`` is its task).
        tasks: the task ids of the run, in one-hot order.

    Raises:
        ValueError: for an empty ``tasks`` or an env whose observations are not a Dict.
    """

    def __init__(self, env: gym.Env, tasks: Sequence[int]) -> None:
        super().__init__(env)
        if not tasks:
            raise ValueError("tasks: expected at least one task id")
        if not isinstance(env.observation_space, gym.spaces.Dict):
            raise ValueError(
                f"env: expected Dict observations, got {type(env.observation_space).__name__}"
            )
        self.tasks = [int(t) for t in tasks]
        self.observation_space = gym.spaces.Dict(
            {
                **env.observation_space.spaces,
                TASK_ONE_HOT_KEY: gym.spaces.Box(0.0, 1.0, (len(self.tasks),), np.float32),
            }
        )

    def observation(self, observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The observation with the one-hot of the current task added."""
        return {**observation, TASK_ONE_HOT_KEY: one_hot(self.tasks, self.unwrapped.task_id)}


def make_libero_env(
    suite: str,
    task_id: int,
    chunk_size: int,
    state_features: str,
    cameras: tuple[str, ...],
    image_size: int,
    reward_type: str,
    shaping_scale: float,
    horizon: int | None,
    render: bool,
    init_state_ids: tuple[int, ...],
    one_hot_tasks: tuple[int, ...] | None,
    train_horizon: int | None = None,
) -> gym.Env:
    """One LIBERO env of a (multi-task) run: `LiberoEnv` of ``task_id`` whose training
    resets draw from ``init_state_ids`` (`TaskInitStates`, ``train_horizon`` steps), with
    the task one-hot of ``one_hot_tasks`` (`TaskOneHot`, None: none) and action chunks
    of ``chunk_size`` (`ActionChunk`, 1: none); ``render``: ``render_mode="rgb_array"``
    (the video's env). The other arguments are `LiberoEnv`'s."""
    from pipelined_vec_env.libero.env import LiberoEnv
    from pipelined_vec_env.wrappers.action_chunk import ActionChunk

    env: gym.Env = LiberoEnv(
        suite,
        task_id,
        cameras=cameras,
        image_size=image_size,
        reward_type=reward_type,
        shaping_scale=shaping_scale,
        horizon=horizon,
        state_features=state_features,
        render_mode="rgb_array" if render else None,
    )
    env = TaskInitStates(env, task_id, init_state_ids, train_horizon)
    if one_hot_tasks:
        env = TaskOneHot(env, one_hot_tasks)
    return ActionChunk(env, chunk_size) if chunk_size > 1 else env


def one_hot(tasks: Sequence[int], task_id: int) -> np.ndarray:
    """float32 ``(len(tasks),)``, 1 at ``tasks.index(task_id)``.

    Raises:
        ValueError: if ``task_id`` is not in ``tasks``.
    """
    if task_id not in tasks:
        raise ValueError(f"task_id: expected one of {list(tasks)}, got {task_id}")
    vector = np.zeros(len(tasks), dtype=np.float32)
    vector[list(tasks).index(task_id)] = 1.0
    return vector


def per_task_training_success(per_env: dict[str, Any], num_tasks: int) -> list[float | None]:
    """Each task's training success rate from one half of ``summary["train_success_per_env"]``
    (env ``i`` trains task ``i % T``; its envs' episodes pooled).

    Args:
        per_env: ``{"episodes": [...], "success_rate": [...]}``, one entry per env.
        num_tasks: ``T``.

    Returns:
        ``T`` rates in ``[0, 1]`` in task order, None for a task with no episode.
    """
    episodes = np.zeros(num_tasks)
    successes = np.zeros(num_tasks)
    for env, (n, rate) in enumerate(zip(per_env["episodes"], per_env["success_rate"], strict=True)):
        episodes[env % num_tasks] += n
        successes[env % num_tasks] += 0.0 if rate is None else rate * n
    return [float(k / n) if n else None for k, n in zip(successes, episodes, strict=True)]


def per_task_success(successes: Sequence[bool], num_tasks: int) -> list[float]:
    """Success rate of each task from an evaluation's episodes (episode ``j``: task ``j % T``).

    Args:
        successes: per-episode success, in episode order (``T * n`` of them).
        num_tasks: ``T``.

    Returns:
        ``T`` rates in ``[0, 1]``, in task order.

    Raises:
        ValueError: if the episodes are not a whole number of rounds over the tasks.
    """
    if num_tasks < 1 or not successes or len(successes) % num_tasks:
        raise ValueError(
            f"successes: expected a multiple of num_tasks={num_tasks} episodes, got {len(successes)}"
        )
    values = np.asarray(successes, dtype=np.float64).reshape(-1, num_tasks)
    return [float(v) for v in values.mean(axis=0)]


def _demo_env(suite: str, task_id: int, ids: tuple[int, ...]) -> gym.Env:
    from pipelined_vec_env.libero.collect import InitStateCycle
    from pipelined_vec_env.libero.env import LiberoEnv

    return InitStateCycle(LiberoEnv(suite, task_id, state_features="both"), ids)


def _check_demo_arguments(
    tasks: Sequence[int], init_state_ids: Sequence[int], noise_std: float
) -> tuple[list[int], tuple[int, ...]]:
    """``collect_suite_demos``' task ids and init state ids as ints, checked (ValueError)."""
    task_ids, ids = [int(t) for t in tasks], tuple(int(k) for k in init_state_ids)
    if not task_ids or len(set(task_ids)) != len(task_ids):
        raise ValueError(f"tasks: expected distinct task ids, got {task_ids}")
    if not ids or len(set(ids)) != len(ids):
        raise ValueError(f"init_state_ids: expected distinct ids, got {list(ids)}")
    if noise_std < 0:
        raise ValueError(f"noise_std: expected >= 0, got {noise_std}")
    return task_ids, ids


def collect_suite_demos(
    suite: str,
    tasks: Sequence[int],
    init_state_ids: Sequence[int],
    *,
    noise_std: float = 0.0,
    num_workers: int = 2,
    seed: int = 0,
    step_timeout: float = 120.0,
) -> Any:
    """The scripted expert on every task from each init state: one vector env, one env per task.

    Env ``t`` runs task ``tasks[t]`` from ``init_state_ids`` in order (`InitStateCycle`);
    the envs share ``num_workers`` worker processes (one per pipeline stage), so the
    simulators are built once. Noise (DART) as `pipelined_vec_env.libero.collect_demos`:
    on xyz of the executed action, the label stays the expert's.

    Args:
        suite: the LIBERO suite.
        tasks: task ids (distinct).
        init_state_ids: init states of every task, one episode each.
        noise_std: std of the executed action's xyz noise.
        num_workers: worker processes (at most ``len(tasks)``).
        seed: seed of the noise.
        step_timeout: seconds one vector step may take.

    Returns:
        A `pipelined_vec_env.libero.demos.DemoSet` of the successful episodes, ordered by
        init state, then task (so the file's last demos are the last init state of every
        task); each demo's attrs name its ``task_id``, ``init_state_id`` and
        ``language_instruction``; the set's ``collection`` attrs count ``attempts``,
        ``successes`` and ``successes_per_task``.

    Raises:
        ValueError: for empty or repeated tasks or init states, a negative noise, or a
            suite without a scripted expert (`expert_for`), before any worker starts.
    """
    from pipelined_vec_env import PipelinedVectorEnv
    from pipelined_vec_env.libero import suites
    from pipelined_vec_env.libero.demos import Demo, DemoSet

    tasks, ids = _check_demo_arguments(tasks, init_state_ids, noise_std)
    experts = [expert_for(suite, t) for t in tasks]
    n = len(tasks)
    stages = max(1, min(num_workers, n))
    envs = PipelinedVectorEnv(
        [functools.partial(_demo_env, suite, t, ids) for t in tasks],
        num_stages=stages,
        envs_per_worker=math.ceil(n / stages),
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    done: dict[tuple[int, int], Any] = {}
    episode, attempts = [0] * n, 0
    buffers: list[dict[str, list[Any]]] = [{"obs": [], "actions": []} for _ in range(n)]
    try:
        obs, _ = envs.reset()
        while min(episode) < len(ids):
            labels = _expert_actions(experts, obs)
            executed = labels.copy()
            if noise_std > 0:
                executed[:, :3] += rng.normal(0.0, noise_std, size=(n, 3))
            envs.step_async(np.clip(executed, -1.0, 1.0).astype(np.float32))
            next_obs, _, terminated, truncated, _ = envs.step_wait(timeout=step_timeout)
            for i in range(n):
                if episode[i] >= len(ids):
                    continue
                buffers[i]["obs"].append(obs["goal_features"][i])
                buffers[i]["actions"].append(labels[i])
                if terminated[i] or truncated[i]:
                    attempts += 1
                    if terminated[i]:
                        done[(episode[i], i)] = (
                            np.stack(buffers[i]["obs"]),
                            np.stack(buffers[i]["actions"]),
                        )
                    buffers[i] = {"obs": [], "actions": []}
                    episode[i] += 1
            obs = next_obs
    finally:
        envs.close()
    demos = []
    for (k, i), (features, actions) in sorted(done.items()):
        task = suites.get_task(suite, tasks[i])
        demos.append(
            Demo(
                obs={"goal_features": features.astype(np.float32)},
                actions=actions.astype(np.float32),
                rewards=np.zeros(len(actions), np.float32),
                dones=np.eye(1, len(actions), len(actions) - 1, dtype=np.uint8)[0],
                attrs={
                    "task_id": tasks[i],
                    "init_state_id": ids[k],
                    "language_instruction": task.language,
                    "success": True,
                },
            )
        )
    per_task = [sum(1 for (_, i) in done if i == t) for t in range(n)]
    wall_s = time.perf_counter() - start
    logger.info(
        "%d/%d expert episodes succeeded on %d tasks in %.0f s", len(demos), attempts, n, wall_s
    )
    attrs = {
        "env_name": f"{suite}_multitask",
        "env_args": {"env_kwargs": {"suite": suite, "tasks": tasks}},
        "problem_info": {
            "suite": suite,
            "tasks": tasks,
            "language_instructions": [suites.get_task(suite, t).language for t in tasks],
        },
        "collection": {
            "expert": ", ".join(sorted({type(e).__name__ for e in experts})),
            "noise_std": float(noise_std),
            "seed": int(seed),
            "init_state_ids": list(ids),
            "attempts": attempts,
            "successes": len(demos),
            "successes_per_task": per_task,
            "wall_s": wall_s,
        },
    }
    return DemoSet(demos=demos, attrs=attrs)


def add_task_one_hot(demos: Any, tasks: Sequence[int]) -> None:
    """Add ``obs["task_one_hot"]`` ``(T_demo, len(tasks))`` to every demo, from its
    ``attrs["task_id"]`` (in place).

    Raises:
        ValueError: for a demo whose task is not in ``tasks``.
    """
    for demo in demos.demos:
        demo.obs[TASK_ONE_HOT_KEY] = np.tile(
            one_hot(tasks, int(demo.attrs["task_id"])), (len(demo), 1)
        )
