"""The work of a robosuite step that a `LiberoEnv` step may skip, nothing it returns changed.

robosuite runs its arm controller at every physics substep (25 per 20 Hz control step):
``sim.forward()``, the controller, ``sim.step()``. Three parts of that work are thrown
away in a `LiberoEnv`:

- **The controller's own** ``mj_forward``. The controller's update (robosuite 1.4
  ``Controller.update``) calls it again on the state the loop just brought forward.
  Nothing in between changes the positions, velocities, controls or the solver's warm
  start that ``mj_forward`` reads (MuJoCo saves the warm start in ``mj_step``), so the
  second call writes the same values again. `LeanStep.step` turns it into a no-op for the
  length of one step; during a reset the controller's forward runs as before (the state
  was just set there).
- **The acceleration half of the loop's** ``mj_forward`` at substeps 2 to 25. The loop's
  forward runs with the controls of the substep before, and ``mj_step`` then runs the
  whole forward pass again with the new ones. The controller reads only what depends on
  positions and velocities (site poses and velocities, Jacobians, the mass matrix, bias
  forces), so those substeps run MuJoCo's split step instead: ``mj_step1`` (the position
  and velocity stages) where the loop calls forward and ``mj_step2`` (actuation,
  acceleration, constraints, integration) where it calls step; MuJoCo documents the pair
  as ``mj_step`` with the controls set in between, for every integrator but RK4, for
  which the split is not used. The first substep keeps the full forward: robosuite's
  robot reads the end-effector force sensors (an acceleration stage) there.
- **The observables** (about 40 robosuite sensors, looked at every substep and sampled
  every control step) when the observation does not read them: with
  ``state_features="goal"`` it is built from the simulator through
  `pipelined_vec_env.libero.goal_features`. `LeanStep.disable_observables` turns them
  off, camera images excepted.

Trajectories are bit-identical with and without (``tests/test_libero_lean_step.py``
compares the observations, rewards, infos and the simulator state after every step and
reset). What it saves, interleaved in one process: docs/libero_figures.md, "Cost".
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import mujoco

__all__ = ["LeanStep"]


class _SimProxy:
    """A robosuite ``MjSim`` seen through a proxy: every attribute is the real one's
    unless a subclass overrides it. ``data`` and ``model``, which an ``MjSim`` sets once
    and robosuite reads hundreds of times a step, are held here, so only rarer reads go
    through ``__getattr__``."""

    __slots__ = ("data", "model", "sim")

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.data, self.model = sim.data, sim.model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)


class _ControllerSim(_SimProxy):
    """The simulator as one robosuite controller sees it: ``forward`` does nothing while
    ``skip_forward`` is set."""

    __slots__ = ("skip_forward",)

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self.skip_forward = False

    def forward(self) -> None:
        if not self.skip_forward:
            self.sim.forward()


class _LoopSim(_SimProxy):
    """The simulator as robosuite's step loop sees it during one control step (``start``
    begins one): substep 1 runs the real ``forward`` and ``step``; substeps 2 to
    ``substeps`` run ``mj_step1`` for the loop's ``forward`` and ``mj_step2`` for its
    ``step``. Past the last substep every call goes to the real ``MjSim`` again.

    MuJoCo's own ``MjModel`` and ``MjData``, which the split step takes, are the
    ``_model`` and ``_data`` of robosuite's wrappers (robosuite's ``MjSim.step`` reads
    them the same way); they are read once here."""

    __slots__ = ("mj_data", "mj_model", "substep", "substeps")

    def __init__(self, sim: Any, substeps: int) -> None:
        super().__init__(sim)
        self.substeps, self.substep = substeps, 0
        self.mj_model, self.mj_data = sim.model._model, sim.data._data

    def start(self) -> _LoopSim:
        """Begin a control step at substep 1; return self."""
        self.substep = 0
        return self

    def forward(self) -> None:
        if 0 < self.substep < self.substeps:
            mujoco.mj_step1(self.mj_model, self.mj_data)
        else:
            self.sim.forward()

    def step(self, with_udd: bool = True) -> None:
        if 0 < self.substep < self.substeps:
            mujoco.mj_step2(self.mj_model, self.mj_data)
        else:
            self.sim.step(with_udd)
        self.substep += 1


class LeanStep:
    """Steps one robosuite task env without the work whose results nothing reads.

    Args:
        task_env: The robosuite env (LIBERO's ``ControlEnv.env``): its ``robots`` (each
            with a ``controller`` holding ``sim``), ``observation_names`` and
            ``modify_observable`` are used. A robot without that controller layout (another
            robosuite version) is stepped as robosuite does, without the skip.
    """

    def __init__(self, task_env: Any) -> None:
        self.task_env = task_env
        # the substep count of robosuite's loop, computed as robosuite computes it
        self._substeps = int(task_env.control_timestep / task_env.model_timestep)
        self._split = task_env.sim.model.opt.integrator != mujoco.mjtIntegrator.mjINT_RK4
        self._loop_sim: _LoopSim | None = None

    def disable_observables(self, keep: Container[str] = ()) -> None:
        """Turn off every robosuite observable not named in ``keep``. The env's raw
        observation dict then lacks them, so call this only when nothing reads them
        (``state_features="goal"``)."""
        for name in self.task_env.observation_names:
            if name not in keep:
                self.task_env.modify_observable(name, "enabled", False)

    def step(self, control_env: Any, action: Any) -> Any:
        """``control_env.step(action)`` (robosuite's 4-tuple) with the work above skipped.
        The controllers are rebuilt at every robosuite reset, so their simulator is
        wrapped again here where needed; the loop's simulator is swapped in for the
        length of this call."""
        wrapped = self._controller_sims()
        for sim in wrapped:
            sim.skip_forward = True
        real_sim = self.task_env.sim
        if self._split:
            self.task_env.sim = self._loop_sim_of(real_sim).start()
        try:
            return control_env.step(action)
        finally:
            self.task_env.sim = real_sim
            for sim in wrapped:
                sim.skip_forward = False

    def _loop_sim_of(self, sim: Any) -> _LoopSim:
        """The loop's proxy of ``sim``, made once per simulator."""
        if self._loop_sim is None or self._loop_sim.sim is not sim:
            self._loop_sim = _LoopSim(sim, self._substeps)
        return self._loop_sim

    def _controller_sims(self) -> list[_ControllerSim]:
        wrapped = []
        for robot in self.task_env.robots:
            controller = getattr(robot, "controller", None)
            sim = getattr(controller, "sim", None)
            if sim is None:
                continue
            if type(sim) is not _ControllerSim:
                sim = _ControllerSim(sim)
                controller.sim = sim
            wrapped.append(sim)
        return wrapped
