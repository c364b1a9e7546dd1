"""The DSL itself: the expressions a program appends (ir), gen / select / roles / tools (api,
tools), program states and forks (state), the executor that runs a state's expressions on threads
or greenlets (executor, runners), programs and tracing (program, tracer), and the Backend
interface every place a program runs provides (backend). It knows no concrete backend."""
