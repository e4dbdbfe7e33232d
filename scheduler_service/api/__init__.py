"""The gRPC servicers: SchedulerService (tasks and schedules), the KEDA external scaler and the
health service. Thin: proto in, a call into tasks/ or the store, proto out. May import every
package below it (tasks, workers, dispatch, observe, holds, fleet, wire, store, rows, domain)."""
