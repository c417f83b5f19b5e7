"""The tuner: measure a few layouts on the user's envs and policy, predict the rest with
a layout model, verify the best (``pipelined_vec_env.tune``).

``tuner`` holds ``tune`` and ``measure_layout``; ``layout_model`` simulates a layout from
measured step and inference times; ``selection`` picks the layouts to measure and verify;
``result`` is what ``tune`` returns (``TuneResult``, its table); ``arguments`` checks
``tune``'s arguments; ``candidates`` spans the layouts it predicts; ``measurement`` measures
the costs the model is fed.

May import: the vector env and everything below it. Nothing imports it but the package's
``__init__``.
"""
