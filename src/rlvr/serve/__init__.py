"""`rlvr serve`: the Tinker API over HTTP, on the trainer ranks, engine and weight sync a run uses.

app.py            the routes: one plain function each, of the server, the asking tenant and the body
server.py         the catalog, and the operations routes share (build a model, save and load states)
tenants.py        API keys -> tenants; a server without keys listens on loopback only
registry.py       sessions, models, sampling sessions, each visible to its tenant alone
futures.py        every request's future (retrieve_future), and the tenant limits on what is in flight
work_line.py      the one worker thread's order: sessions in turn, a model's calls by seq_id
fair_queue.py     the sessions-in-turn queue itself
sample_batcher.py sampling calls gathered into one engine batch per base, of every model on it
saved_states.py   save_state's checkpoints, under each tenant's own folder
model.py          one served model: LoRA trainer ranks + engine + sync probe; checks each request first
protocol.py       the SDK's protobuf bodies (tinker.proto), read and written
refusals.py       what is refused, with which HTTP status
"""
