"""The router that serves: the Triton classifier client (`classifier_client`), its policy
(`policy`), the question-form rules and their fallback (`rules`), small talk (`small_talk`),
per-tenant priors (`tenant_priors`), the model versions and which one is served
(`model_repository`), and the router that swaps to a newly served version without a restart
(`hot_swap`). The routers it is compared with live in `adaptive_rag.routers`."""
