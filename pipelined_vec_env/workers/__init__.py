"""The worker layer: processes (or Ray actors) that own envs, and the caller's side of them.

``pool.WorkerPool`` sends commands to every worker and waits on answers and process
sentinels together; ``worker`` is the serve loop a worker runs (``step_profile``: its envs
stepped serially or on its threads); ``worker_handle`` (one
process) and ``ray_backend`` (one Ray actor) are the two backends; ``protocol`` the typed
commands, ``transport``/``slots`` the wire (pipes and shared-memory slots), ``spinning`` and
``waiting`` the bounded waits, ``failures`` what a dead or failing worker becomes.

May import: the package's base modules (``errors``, ``infos``, ``batching``,
``shared_memory``, ``observations``, ``gl_contexts``) and ``profiling``. Never ``stepping``, ``tuning`` or
the vector env.
"""
