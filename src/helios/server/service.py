"""One served model behind the HTTP API: engine, frontend, admission, metrics and the request path.

`ServedModel.respond(body, receive)` is what the completion endpoints call, in the order the
specification fixes:

1. ingress timestamp (timed requests only) at handler entry, after HTTP JSON decoding;
2. combined-field validation (`RequestError`, HTTP 400) before any capacity is taken;
3. an admission permit (`IngressFull`, HTTP 429), never waited for;
4. CPU preparation (template, tokenize, grammar compile) in one of `frontend_workers` preparation
   slots, run in a preparation thread so the event loop keeps serving, bounded in time, with
   grammar compiles held to fewer slots than there are (`helios.server.preparation`);
5. enqueue timestamp and submission to the model worker; the request's `ResponseBridge` is
   registered with the output workers (`helios.frontend.output_workers`), which take the engine's
   per-round event batches and run each request's output work off the model worker thread; its
   grammar matcher goes to the engine, which owns it from then on (an engine process's commands
   never wait on its pipe: `helios.server.engine_commands`);
6. the response (`helios.server.responses`), which owns the permit from then on.

A request with several choices (``n`` > 1, batched prompts) runs steps 3-6 once per choice, but
step 4 prepares each prompt once: its other choices only compile their own grammar matcher
(`helios.server.fanout`). Each engine request's bridge stamps the request's `RequestRecord` from
its events (latency histograms, access log; `helios.server.request_metrics`).

A model worker that died (`is_healthy` false) serves nothing more: a request that arrives or
finishes preparing after that gets `WorkerUnavailable` (HTTP 503, as `/health` answers; the
request is not at fault) instead of being submitted to end at once in an execution error; requests
the worker held when it died end with its error (500; a stream: one error event).

`interrupt_responses` (the server's drain deadline at shutdown) ends every response still running
with one `ShuttingDown` error; after it, responses whose connections the server then drops end
quietly, and requests still preparing are refused with the same error.

`start` / `shutdown` start and stop the model worker; `shutdown` returns after the worker drained
its current round (an engine process that stopped answering is killed after a bounded wait: its
queued commands get `UNRESPONSIVE_CLOSE_S`, its `Shutdown` record `EngineLink.shutdown`'s deadline), the runtime's tensor-parallel ranks (if any) stopped and the output workers
consumed every event. The object is shared by every request; after construction it is not mutated
except through the engine's and the admission controller's own thread-safe methods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import uuid
import weakref
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Receive
from tokenizers import Tokenizer

from helios.errors import RequestError, ShuttingDown, WorkerNotServing
from helios.frontend.decoding.observation import ObservationClock
from helios.frontend.output_workers import OutputWorkers
from helios.frontend.images.decode import ImageLimits
from helios.frontend.session import FrontendModel, PreparedRequest
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.feedback import TensorGrammar
from helios.runtime.service import Runtime
from helios.runtime.stall_watch import DEFAULT_LIVENESS_TIMEOUT_S, StallWatch
from helios.server.engine_commands import CLOSE_TIMEOUT_S, engine_commands
from helios.server.engine_process import EngineProcessRuntime
from helios.server.frontend_ahead import FrontendAhead
from helios.runtime.records.stats import StatsSnapshot
from helios.server.admission import AdmissionController, AdmissionLimits, Permit
from helios.server.bridge import LoopOutbox, ResponseBridge
from helios.server.metrics import ServerMetrics
from helios.server.fanout import (
    Choice, choice_bodies, fanout_json, fanout_stream, is_prompt_batch, named_batch_prompt, with_choice_seed,
)
from helios.server.request_metrics import LatencyHistograms, RequestRecord, event_stamps
from helios.server.preparation import DEFAULT_PREPARATION_TIMEOUT_S, PreparationGate, PreparationPool
from helios.server.defaults import DEFAULT_SEND_TIMEOUT_S
from helios.server.responses import Lease, json_response, stream_response
from helios.server.schemas import ChatCompletionRequest, CompletionRequest, validate_chat, validate_common


class WorkerUnavailable(ShuttingDown):
    """The model worker died: this server serves no more requests (HTTP 503, type
    ``server_shutting_down``: `helios serve` shuts down so that a supervisor restarts it)."""


UNRESPONSIVE_CLOSE_S = 1.0  # shutdown: queued commands' wait for an engine process that stopped answering
WORKER_UNAVAILABLE = "the model worker died; this server is not serving requests (retry later or on another instance)"


@dataclass(frozen=True)
class ModelCard:
    """What /v1/models reports."""

    served_names: tuple[str, ...]  # the served id first, then its aliases
    owned_by: str  # the publisher namespace the core is signed for
    created: int
    context_tokens: int
    vocab_size: int  # one past the largest sampled id (stop-id range)




def compiles_grammar(body: ChatCompletionRequest) -> bool:
    """Whether preparing `body` may compile a grammar (structured output or tools)."""
    has_format = body.response_format is not None and body.response_format.type != "text"
    return has_format or bool(body.tools)


class ServedModel:
    """See the module docstring."""

    def __init__(self, runtime: Runtime | EngineProcessRuntime, frontend: FrontendModel, admission: AdmissionController,
                 clock: ObservationClock, card: ModelCard, preparation: PreparationGate,
                 send_timeout_s: float | None = DEFAULT_SEND_TIMEOUT_S, output: OutputWorkers | None = None,
                 stream_interval: int = 1, liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S):
        """`output`: the output workers (two when None); the engine's events go to them from now on.
        `stream_interval`: steps per SSE write after a stream's first (`helios.server.bridge`).
        `liveness_timeout_s`: for an engine in this process, how long its worker may complete no
        round with requests pending before it counts as stalled (an engine process's link has its own)."""
        self.runtime = runtime
        self.engine = runtime.engine
        # an in-process engine's progress, sampled whenever `/health` or `/metrics` asks
        self._stall_watch = StallWatch(liveness_timeout_s) if isinstance(self.engine, Engine) else None
        # submit / cancel / stop_matched: never waiting on an engine process's full pipe
        self.commands = engine_commands(runtime)
        self.output = output or OutputWorkers()
        self.engine.connect(self.output.post)
        self.frontend = frontend
        self.admission = admission
        self.clock = clock
        self.card = card
        self.metrics = ServerMetrics(self.stats)
        self.metrics.track_admission(lambda: admission.in_use, admission.limits.num_permits)
        self.latency = LatencyHistograms(self.metrics.registry)
        self.preparation = preparation
        self.send_timeout_s = send_timeout_s
        self.stream_interval = stream_interval
        self._outbox: LoopOutbox | None = None
        self._bridges: weakref.WeakSet[ResponseBridge] = weakref.WeakSet()  # responses not yet collected
        self._is_dropping = False

    @classmethod
    def from_runtime(cls, runtime: Runtime | EngineProcessRuntime, *, queue_capacity: int, frontend_workers: int,
                     owned_by: str = "", clock: ObservationClock | None = None,
                     send_timeout_s: float | None = DEFAULT_SEND_TIMEOUT_S,
                     preparation_timeout_s: float = DEFAULT_PREPARATION_TIMEOUT_S,
                     served_names: tuple[str, ...] = (),
                     image_limits: ImageLimits | None = None, output_workers: int = 2,
                     stream_interval: int = 1,
                     liveness_timeout_s: float = DEFAULT_LIVENESS_TIMEOUT_S,
                     ahead: FrontendAhead | None = None) -> ServedModel:
        """Wires the frontend of a loaded model; the engine is not started (see `start`).
        `served_names` (the served id, then aliases) replace the contract's names when given; `ahead`:
        the tokenizer and grammar compiler built while the model loaded, taken where they match."""
        model = runtime.model
        vocab_size, eos_token_ids = model.prepared.sampled_range[1], model.settings.eos_token_ids
        built = ahead.parts_for(model.tokenizer_json, vocab_size, eos_token_ids) if ahead is not None else None
        tokenizer, grammar = built or (Tokenizer.from_str(model.tokenizer_json.decode("utf-8")), None)
        serving = model.prepared.contract
        names = tuple(served_names) or (serving.served_id, *serving.aliases)
        frontend = FrontendModel.from_contract(model.prepared, tokenizer, model.chat_template, settings=model.settings,
                                               served_names=names, image_limits=image_limits or ImageLimits(),
                                               grammar=grammar)
        limits = AdmissionLimits(model.settings.max_concurrency, queue_capacity, frontend_workers)
        card = ModelCard(names, owned_by, int(time.time()),
                         model.settings.context_tokens, model.prepared.sampled_range[1])
        gate = PreparationGate(PreparationPool(frontend_workers), frontend_workers, preparation_timeout_s)
        return cls(runtime, frontend, AdmissionController(limits), clock or ObservationClock(), card, gate,
                   send_timeout_s, OutputWorkers(output_workers), stream_interval, liveness_timeout_s)

    def start(self) -> None:
        self.engine.start()

    def shutdown(self) -> None:
        """Stops the model worker once its current round is done, then any tensor-parallel ranks,
        then the output workers once they consumed every event (blocking; idempotent)."""
        if self.commands is not self.engine:  # the commands already made reach the engine before its shutdown
            is_unresponsive = getattr(self.engine, "unresponsive_reason", None) is not None
            self.commands.close(UNRESPONSIVE_CLOSE_S if is_unresponsive else CLOSE_TIMEOUT_S)
        self.runtime.close()
        self.output.close()

    def interrupt_responses(self) -> int:
        """Event loop: ends every running response with a `ShuttingDown` error (a stream gets one
        error event) and refuses requests still preparing; returns how many were running."""
        self._is_dropping = True
        error = ShuttingDown("server shutting down")
        return sum(bridge.interrupt(error) for bridge in list(self._bridges))

    @property
    def is_dropping(self) -> bool:
        """Whether the drain deadline passed (set by `interrupt_responses`)."""
        return self._is_dropping

    @property
    def is_healthy(self) -> bool:
        return self.engine.is_healthy

    def health_problem(self) -> str | None:
        """Why `/health` answers 503 (the model worker died, or `liveness_problem`), or None."""
        if not self.engine.is_healthy:
            return getattr(self.engine, "failure", None) or "the model worker died"
        problem = self.liveness_problem()
        return problem[1] if problem is not None else None

    def liveness_problem(self) -> tuple[str, str] | None:
        """`/health`'s 503 status and reason for a live engine process that does not serve:
        ("unresponsive", why) when it sent no heartbeat for its liveness timeout (stopped or hung),
        ("stalled", why) when its heartbeats showed requests pending and its worker completing no
        round for that long (stuck in a step); else None (`helios.runtime.engine_link`). An engine in
        this process is sampled here: ("stalled", why) when the samples of its progress showed the
        same (`helios.runtime.stall_watch`)."""
        reason = getattr(self.engine, "unresponsive_reason", None)
        if reason is not None:
            return "unresponsive", reason
        if self._stall_watch is not None:
            self._stall_watch.observe(self.engine.progress, self.engine.has_pending, time.monotonic())
            reason = self._stall_watch.reason
        else:
            reason = getattr(self.engine, "stalled_reason", None)
        if reason is not None:
            return "stalled", reason
        return None

    def stats(self) -> StatsSnapshot:
        # `helios_healthy` follows `/health`: 0 once the worker died or while it is unresponsive or stalled
        return dataclasses.replace(self.engine.stats.snapshot(), healthy=self.health_problem() is None)

    async def respond(self, body: ChatCompletionRequest | CompletionRequest, receive: Receive,
                      record: RequestRecord | None = None) -> Response:
        """Runs one completion request (steps 1-6 of the module docstring); `record` (the access
        log's, made at arrival) gets its timings and token counts."""
        record = record or RequestRecord.now()
        record.model_name, record.user = self.card.served_names[0], body.user
        ingress_ns = self.clock.now_ns() if body.return_token_timestamps is True else None
        is_chat = isinstance(body, ChatCompletionRequest)
        (validate_chat if is_chat else validate_common)(body, self.card.vocab_size)
        self._check_serving()
        several = choice_bodies(body, is_chat)
        if several is not None:
            param = "n" if (body.n or 1) > 1 else "prompt"  # what a request of too many choices names
            return await self._respond_choices(several, is_chat, ingress_ns, receive, record, param,
                                               is_prompt_batch(body, is_chat))
        permit = self.admission.acquire()
        try:
            prepare = self.frontend.prepare_chat if is_chat else self.frontend.prepare_completion
            prepared = await self.preparation.run(prepare, body, ingress_ns, compiles=is_chat and compiles_grammar(body))
            self._check_serving()
            bridge = self._submit(prepared, permit, record)
        except BaseException:
            permit.release()
            raise
        lease = Lease(bridge, self.send_timeout_s, lambda: self._is_dropping)
        if prepared.head.options.is_stream:
            return stream_response(lease, prepared.new_stream())
        return await json_response(lease, prepared, receive)

    async def _respond_choices(self, bodies, is_chat: bool, ingress_ns: int | None, receive: Receive,
                               record: RequestRecord, param: str, is_batch: bool) -> Response:
        """Several choices (``n``, batched prompts): one engine request each (`helios.server.fanout`);
        every prompt is prepared (template, images, tokens, grammar check) once, and its other choices
        are derived from that (`FrontendModel.prepare_choice`), all before any is submitted, so a batch
        with a prompt it cannot serve is that prompt's 400 (naming ``prompt[i]``), never a partial
        answer."""
        permits = self.admission.acquire_many(len(bodies), param)
        try:
            prepare = self.frontend.prepare_chat if is_chat else self.frontend.prepare_completion
            base = uuid.uuid4().hex
            prepared, firsts = [], {}
            for k, (prompt_index, choice, body) in enumerate(bodies):
                first = firsts.get(prompt_index)
                if first is not None and first.grammar is None:
                    one = self.frontend.prepare_choice(first, f"{base}-{k}")
                elif first is not None:  # its grammar matcher is compiled again: off the event loop
                    one = await self.preparation.run(self.frontend.prepare_choice, first, f"{base}-{k}", compiles=True)
                else:
                    try:
                        one = await self.preparation.run(functools.partial(prepare, request_id=f"{base}-{k}"), body,
                                                         ingress_ns, compiles=is_chat and compiles_grammar(body))
                    except RequestError as error:
                        raise named_batch_prompt(error, prompt_index) if is_batch else error
                    first = firsts[prompt_index] = one
                prepared.append(with_choice_seed(one, first.params.sampling.seed, choice))
            self._check_serving()
        except BaseException:
            for permit in permits:
                permit.release()
            raise
        choices = []
        records = [record, *(record.choice(index) for index, _, _ in bodies[1:])]  # all before any can end
        try:
            for one, permit, (index, _, _), choice_record in zip(prepared, permits, bodies, records):
                choices.append(Choice(one, self._submit(one, permit, choice_record), index))
        except BaseException:  # the choices submitted are cancelled (each permit back with its end), the rest freed
            for choice in choices:
                choice.bridge.close()
            for permit in permits[len(choices):]:
                permit.release()
            raise
        if prepared[0].head.options.is_stream:
            return fanout_stream(choices, self.send_timeout_s, lambda: self._is_dropping)
        return await fanout_json(choices, receive, self.send_timeout_s, lambda: self._is_dropping)

    def _check_serving(self) -> None:
        """Refuses a request the server will not run: past the drain deadline, with the model
        worker dead (see the module docstring), or while `/health` says it is unresponsive or
        stalled (a 503 naming why, for as long as `/health` says so)."""
        if self._is_dropping:
            raise ShuttingDown("server shutting down")
        if not self.engine.is_healthy:
            raise WorkerUnavailable(WORKER_UNAVAILABLE)
        problem = self.liveness_problem()
        if problem is not None:  # a request taken now would wait with no bound (a SIGSTOPped engine process)
            raise WorkerNotServing(f"the model worker is {problem[0]}: {problem[1]}; this server takes no new "
                                   "requests until it serves again (retry later or on another instance)")

    def _loop_outbox(self) -> LoopOutbox:
        """The outbox of the running event loop (one per loop; the server runs one loop)."""
        loop = asyncio.get_running_loop()
        if self._outbox is None or self._outbox.loop is not loop:
            self._outbox = LoopOutbox(loop)
        return self._outbox

    def _submit(self, prepared: PreparedRequest, permit: Permit, record: RequestRecord) -> ResponseBridge:
        output = prepared.new_output()
        spec = prepared.request_spec(images=prepared.images)
        observe = event_stamps(record, self.latency, counts_at_end=spec.has_host_stops,
                               hides_output=prepared.head.prompt.hides_output)
        bridge = ResponseBridge(
            prepared.request_id, output, is_stream=prepared.head.options.is_stream, permit=permit,
            cancel=self.commands.cancel, origin_ns=self.clock.origin_ns, outbox=self._loop_outbox(),
            stop=self.commands.stop_matched, observe=observe, stream_interval=self.stream_interval,
            show_finish=record.show_finish,
        )
        grammar = TensorGrammar(prepared.grammar) if prepared.grammar is not None else None
        request = EngineRequest(spec, grammar=grammar)
        output.mark_enqueue(self.clock)
        record.submitted_s = time.monotonic()
        record.prompt_len = len(spec.prompt_ids)  # the access line's count if the response ends before the request
        self._bridges.add(bridge)
        self.output.register(prepared.request_id, bridge)
        self.commands.submit(request)
        return bridge
