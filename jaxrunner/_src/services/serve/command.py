"""``jaxrunner serve``: serve a policy to external environments from the command line (the
serve extra imported only when it runs, so ``jaxrunner --help`` works without it)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from jaxrunner.errors import InvalidArgumentError, JaxRunnerError


def add_serve_command(commands: Any) -> None:
    """Adds the ``serve`` subcommand to the CLI's subparsers."""
    serve = commands.add_parser(
        "serve",
        help="serve a policy to external environments over HTTP",
        description="Serves a policy over HTTP (jaxrunner.serve.PolicyServer): agents start "
        "episodes, ask for actions and log rewards; their requests are batched into one "
        "jitted policy call. Prints one JSON line {url, token_file, openapi} on stdout, then "
        "serves until Ctrl-C. Needs the serve extra: pip install 'jaxrunner[serve]'.",
    )
    serve.add_argument(
        "--env",
        default="CartPole-v1",
        help="gymnasium id whose spaces the policy serves (default: %(default)s)",
    )
    serve.add_argument(
        "--policy",
        metavar="MODULE:FUNCTION",
        help="FUNCTION(observation_space, action_space) -> (jaxrunner.Policy, params) "
        "(default: a tanh MLP of --hidden sizes with fresh params)",
    )
    serve.add_argument(
        "--hidden",
        type=int,
        nargs="+",
        default=[64, 64],
        metavar="N",
        help="hidden layer sizes of the default MLP policy (default: 64 64)",
    )
    serve.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the default policy's params and the action keys (default: %(default)s)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on; 0.0.0.0 for every interface (default: %(default)s)",
    )
    serve.add_argument(
        "--port", type=int, default=8000, help="0 picks a free port (default: %(default)s)"
    )
    serve.add_argument(
        "--token-file",
        help="file holding the bearer token clients must send, created if missing "
        "(default: ~/.config/jaxrunner/serve-token)",
    )
    serve.add_argument(
        "--max-batch",
        type=int,
        default=64,
        help="the most agent requests per policy call (default: %(default)s)",
    )
    serve.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="after a batch's first request, how long to wait for more (default: %(default)s)",
    )
    serve.add_argument(
        "--max-concurrent",
        type=int,
        default=1024,
        help="the most episodes live at once; more are refused with HTTP 429 "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-episodes-per-client",
        type=int,
        help="the most live episodes per client (default: no limit but --max-concurrent)",
    )
    serve.add_argument(
        "--episode-timeout-s",
        type=float,
        default=300.0,
        help="an episode with no request for this long is ended, truncated (default: %(default)s)",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=2048,
        help="the most open connections; an eighth of them at most without the token "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="the largest request body accepted (default: %(default)s)",
    )
    serve.set_defaults(func=run_serve)


def _load_policy(spec: str | None, args: argparse.Namespace, obs_space: Any, action_space: Any):
    import jax

    if spec is None:
        from jaxrunner.models import mlp_policy

        policy = mlp_policy(action_space, hidden=tuple(args.hidden))
        return policy, policy.init(jax.random.key(args.seed), obs_space)
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise InvalidArgumentError(f"--policy {spec!r}: expected MODULE:FUNCTION.")
    try:
        make = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as err:  # the module's own errors come out whole
        missing = getattr(err, "name", None) or ""  # ImportError: the module not found
        if isinstance(err, ImportError) and not f"{module_name}.".startswith(f"{missing}."):
            raise
        raise InvalidArgumentError(f"--policy {spec!r}: {err}.") from None
    return make(obs_space, action_space)


def run_serve(args: argparse.Namespace) -> int:
    try:
        from jaxrunner._src.services.serve.config import ServerConfig
        from jaxrunner._src.services.serve.server import PolicyServer
    except ImportError as err:
        print(
            f"jaxrunner serve needs the serve extra: pip install 'jaxrunner[serve]' ({err})",
            file=sys.stderr,
        )
        return 2
    import gymnasium

    from jaxrunner._src.services.external import ExternalEnv, ExternalEnvConfig

    try:  # before anything serves: one line naming what is wrong, no traceback
        probe = gymnasium.make(args.env)
        obs_space, action_space = probe.observation_space, probe.action_space
        probe.close()
        policy, params = _load_policy(args.policy, args, obs_space, action_space)
        config = ExternalEnvConfig(
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            max_concurrent=args.max_concurrent,
            max_episodes_per_client=args.max_episodes_per_client,
            episode_timeout_s=args.episode_timeout_s,
        )
        server_config = ServerConfig(
            host=args.host,
            port=args.port,
            token_file=args.token_file,
            max_body_bytes=args.max_body_bytes,
            max_connections=args.max_connections,
        )
        env = ExternalEnv(obs_space, action_space, policy, params, seed=args.seed, config=config)
    except (JaxRunnerError, gymnasium.error.Error) as err:
        print(f"jaxrunner serve: {err}", file=sys.stderr)
        return 2
    with env:
        try:  # the token file, the port
            server = PolicyServer(env, server_config)
        except JaxRunnerError as err:
            print(f"jaxrunner serve: {err}", file=sys.stderr)
            return 2
        info = {
            "url": server.url,
            "token_file": str(server.token_file),
            "openapi": f"{server.url}/openapi.json",
        }
        print(json.dumps(info), flush=True)
        print(f"serving {args.env} on {server.url} (token in {server.token_file})", file=sys.stderr)
        server.serve_forever()
    return 0
