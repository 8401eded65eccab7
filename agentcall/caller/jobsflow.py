"""One ``agentcall jobs`` command from what the person typed to everything it prints.

Both ways it runs go through :func:`run_jobs`: the CLI talking to the relay itself, and the
listener service doing it for a thin ``agentcall jobs`` that handed the request over the local
socket (:mod:`agentcall.compose.listen`). It resolves the other party (contacts), does the work
with :mod:`agentcall.caller.jobs`, and returns a :class:`~agentcall.wire.local.LocalJobsEnded`:
the value :mod:`agentcall.cli.jobs` renders on either path. Lines for stderr while it waits go
to ``on_progress``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from agentcall.caller import jobs
from agentcall.caller.callflow import ended_from_result
from agentcall.local.config import Config
from agentcall.local.contacts import ContactBook
from agentcall.local.home import Home, LocalStateError
from agentcall.local.keystore import load_keys
from agentcall.wire.http import JobInfo
from agentcall.wire.local import LocalJobs, LocalJobsEnded

ProgressSink = Callable[[str], None]


def _bare(info: JobInfo) -> JobInfo:
    """``info`` without its sealed answer (opened here; never printed)."""
    if info.answer is None:
        return info
    return attrs.evolve(info, answer=None, terminal=None)


async def run_jobs(
    reactor: Any,
    home: Home,
    config: Config,
    on_progress: ProgressSink,
    *,
    api: jobs.JobRoutes,
    command: str,
    target: str | None,
    job_id: str | None = None,
    wait_s: int = 0,
) -> LocalJobsEnded:
    """Run ``command`` (list, get or cancel) as this installation, with the arguments as
    ``agentcall jobs`` takes them (``target`` as typed); every way it can end is the value."""
    address: str | None = None
    try:
        if target is not None:
            try:
                address = ContactBook(home).resolve(target, config.org)
            except LocalStateError as exc:
                return LocalJobsEnded.trouble(reactor.seconds(), "bad_target", str(exc))
        if command == "list":
            listed = await jobs.list_jobs(api, address)
            return LocalJobsEnded(int(reactor.seconds()), address, jobs=tuple(map(_bare, listed)))
        if address is None or job_id is None:
            raise ValueError("get and cancel name the other party and the job")
        if command == "get":
            return await _get(reactor, home, config, address, job_id, wait_s, on_progress, api)
        return await _cancel(reactor, home, config, address, job_id, wait_s, on_progress, api)
    except jobs.JobUnavailable as exc:
        return LocalJobsEnded.trouble(reactor.seconds(), exc.code, str(exc), address)


async def run_request(
    reactor: Any,
    home: Home,
    config: Config,
    request: LocalJobs,
    on_progress: ProgressSink,
    *,
    api: jobs.JobRoutes,
) -> LocalJobsEnded:
    """:func:`run_jobs` for a request a thin CLI sent over the local socket."""
    return await run_jobs(
        reactor,
        home,
        config,
        on_progress,
        api=api,
        command=request.command,
        target=request.target,
        job_id=request.job_id,
        wait_s=request.wait_s,
    )


async def _get(
    reactor: Any,
    home: Home,
    config: Config,
    address: str,
    job_id: str,
    wait_s: int,
    on_progress: ProgressSink,
    api: jobs.JobRoutes,
) -> LocalJobsEnded:
    try:
        keys = load_keys(home)
    except LocalStateError as exc:
        return LocalJobsEnded.trouble(reactor.seconds(), "local_error", str(exc), address)
    if wait_s:
        on_progress(f"waiting up to {wait_s} s for job {job_id}…")
    status = await jobs.fetch(
        reactor, home, keys, config.relay_origin, api, address, job_id, wait_s=wait_s
    )
    result = None if status.result is None else ended_from_result(status.result, None)
    return LocalJobsEnded(
        int(reactor.seconds()), status.address, info=_bare(status.info), result=result
    )


async def _cancel(
    reactor: Any,
    home: Home,
    config: Config,
    address: str,
    job_id: str,
    wait_s: int,
    on_progress: ProgressSink,
    api: jobs.JobRoutes,
) -> LocalJobsEnded:
    def waiting(info: JobInfo) -> None:
        # Only said when it waits: a queued job is cancelled without delay.
        on_progress(
            f"cancelling job {info.job_id} to {address}: it is {info.state}; waiting up to "
            f"{wait_s} s for its listener to stop it…"
        )

    info = await jobs.cancel(
        reactor,
        home,
        config.relay_origin,
        api,
        address,
        job_id,
        wait_s=wait_s,
        on_wait=waiting,
    )
    return LocalJobsEnded(int(reactor.seconds()), address, info=_bare(info))
