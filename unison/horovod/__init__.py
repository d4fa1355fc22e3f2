"""The Horovod engine, framework-neutral: what ``unison.torch``, ``unison.tensorflow``
and ``unison.keras`` share.

Negotiation (:mod:`.negotiation`, :mod:`.cache`), the engine of one process set and its
run state (:mod:`.engine`, :mod:`.state`), the control channel (:mod:`.channel`), the
data movement (:mod:`.execution`, :mod:`.fusion`, :mod:`.carried`, :mod:`.steady`,
:mod:`.adasum`), the stall inspector and timeline, handles, settings, process sets
(:mod:`.basics`), the ``*_async`` API on buffers (:mod:`.ops`), Python objects
(:mod:`.functions`) and elastic state (:mod:`.elastic`). It moves
:class:`unison.buffers.Buffer` views and imports no framework: each front end checks
its tensors, views them as buffers without copying, and turns the results back into
its own tensors.
"""
