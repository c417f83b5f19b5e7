"""The tuner: measure a few layouts on the user's envs and policy, predict the rest with
a layout model, verify the best (``pipelined_vec_env.tune``).

``tuner`` holds ``tune``, its phases in order: ``arguments`` checks its arguments,
``candidates`` spans the layouts it predicts, ``measurement`` measures the costs the model is
fed, ``layout_model`` simulates each layout from them, ``verification`` runs the best with
``measure_layout`` in rounds, ``selection`` decides between the layouts those rounds cannot
separate, and ``result`` is what ``tune`` returns (``TuneResult``, its table).

May import: the vector env and everything below it. Nothing imports it but the package's
``__init__``.
"""
