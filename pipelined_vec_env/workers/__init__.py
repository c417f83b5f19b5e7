"""The worker layer: processes (or Ray actors) that own envs, and the caller's side of them.

``pool.WorkerPool`` sends commands to every worker and waits on answers and process
sentinels together; ``worker`` is the serve loop a worker runs (``worker_envs``: its envs;
``step_profile``: them stepped serially or on its threads; ``answer_pickling``: its answers
pickled; ``process_setup``: its process's set-up); ``worker_handle`` (one process;
``process_backend`` its waits on many) and ``ray_backend`` (one Ray actor) are the two
backends; ``protocol`` the typed commands, ``transport``/``slots``/``info_columns`` the wire
(pipes, shared-memory slots, infos as columns), ``spinning`` and ``waiting`` the bounded
waits, ``failures`` what a dead or failing worker becomes.

May import: the package's base modules (``errors``, ``infos``, ``batching``,
``shared_memory``, ``observations``, ``gl_contexts``) and ``profiling``. Never ``stepping``, ``tuning`` or
the vector env.
"""
