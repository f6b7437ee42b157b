"""The names the engine side (plugin.py, loaded in every vLLM process) and the worker side
(transfer.py, which imports vLLM's worker classes) both use: kept apart so that neither
imports the other for them."""

REMOTE_ENV = "WVC_VLLM_REMOTE"  # the remote a server follows, set by whoever starts it (transfer.followed)
BRANCH_ENV = "WVC_VLLM_BRANCH"  # its branch; unset: the one init names (default main)
REPOSITORY_ENV = "WVC_VLLM_REPOSITORY"  # a local clone whose chunks it uses (session.lent_chunks); unset: its --model's
# the follower's worker methods (worker_methods.py), which the plugin adds to vLLM's worker wrapper and calls by name
LOADED_COMMIT = "wvc_loaded_commit"
UNUSABLE = "wvc_unusable"
PREFETCH = "wvc_prefetch"  # start fetching the next version while serving
PREFETCHING = "wvc_prefetching"  # whether that fetch still runs
