"""The stepping modes over one worker pool.

``stages`` splits the envs into stages with their own in-flight state; ``stage_stepping``
runs ``step_async(actions, stage)`` / ``step_wait(stage)`` and the whole-env step;
``decoupled`` and ``decoupled_methods`` the EnvPool-style ``async_reset`` / ``recv`` /
``send``; ``channel`` and ``actors`` the inference channel, where fewer inference actors
batch whatever envs are ready and route actions back by env id (``rollout_records``: what a
run of it records and returns).

May import: ``workers`` and the base modules. Never ``tuning``; the vector env only for
type checking.
"""
