// A lowtide worker in Go: one WorkerService.Connect stream, built from stubs that build.sh
// generates from the repository's protos/ with protoc-gen-go and protoc-gen-go-grpc. It runs
// `total`, a typed activity (JSON in, JSON out, as the Python and Node clients send typed values),
// `echo` (the result is the payload) and `average` (which panics on an empty list: a panic fails
// the attempt, never the worker), heartbeats at the intervals the welcome names (busy,
// and idle while nothing runs), and on SIGTERM or a scheduler's Drain takes no new work, lets
// running attempts report, and exits 0.
//
// Configured by environment: LOWTIDE_TARGET (default 127.0.0.1:50051), LOWTIDE_POOL (default),
// LOWTIDE_QUEUES (comma-separated, default), LOWTIDE_SLOTS (4).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"

	pb "lowtide/lowtidev1"
)

// typed makes an activity of a function of JSON values: the payload of a typed task (one with
// `content-type: application/json`, see TaskSpec.payload in protos/lowtide/v1/task.proto) is
// decoded into P, and the result R goes back as JSON, which a typed client decodes again.
func typed[P, R any](fn func(P) (R, error)) func([]byte) ([]byte, error) {
	return func(payload []byte) ([]byte, error) {
		var params P
		if err := json.Unmarshal(payload, &params); err != nil {
			return nil, fmt.Errorf("the payload is not the JSON this activity takes: %w", err)
		}
		result, err := fn(params)
		if err != nil {
			return nil, err
		}
		return json.Marshal(result)
	}
}

// Scores and Total are `total`'s parameter and result.
type Scores struct {
	Name   string    `json:"name"`
	Values []float64 `json:"values"`
}

type Total struct {
	Name  string  `json:"name"`
	Total float64 `json:"total"`
	Count int     `json:"count"`
}

var activities = map[string]func([]byte) ([]byte, error){
	"total": typed(func(s Scores) (Total, error) {
		sum := 0.0
		for _, v := range s.Values {
			sum += v
		}
		return Total{Name: s.Name, Total: sum, Count: len(s.Values)}, nil
	}),
	"echo": func(payload []byte) ([]byte, error) { return payload, nil },
	// Integer division: an empty list panics (division by zero). The panic fails that attempt,
	// with error type "Panic"; the worker and the attempts running beside it go on.
	"average": typed(func(values []int) (int, error) {
		sum := 0
		for _, v := range values {
			sum += v
		}
		return sum / len(values), nil
	}),
}

// protoCodec marshals with google.golang.org/protobuf (APIv2), what protoc-gen-go generates for.
// grpc-go 1.33's default codec goes through github.com/golang/protobuf, which Debian 12 has at
// 1.3 (golang-github-golang-protobuf-1-3-dev), older than APIv2: it cannot marshal these messages.
type protoCodec struct{}

func (protoCodec) Marshal(v interface{}) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (protoCodec) Unmarshal(data []byte, v interface{}) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (protoCodec) Name() string { return "proto" }

func init() { encoding.RegisterCodec(protoCodec{}) }

func env(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

// stream serialises sends: a gRPC stream allows one sender at a time.
type stream struct {
	mu      sync.Mutex
	call    pb.WorkerService_ConnectClient
	running map[int64]*pb.TaskRef
	// Assignment entries read on the stream (Heartbeat.assignments_read), with `running` under mu.
	read uint64
	// Signalled when an attempt starts: an idle heartbeat wait ends, to beat at the busy interval.
	started chan struct{}
}

func (s *stream) send(message *pb.WorkerMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call.Send(message); err != nil {
		log.Printf("send failed: %v", err)
	}
}

func (s *stream) run(assignment *pb.Assignment, done *sync.WaitGroup) {
	defer done.Done()
	result := &pb.TaskResult{Task: assignment.Task}
	fn, known := activities[assignment.ActivityType]
	if !known {
		result.Outcome = &pb.TaskResult_Failure{Failure: &pb.TaskFailure{
			ErrorType: "UnknownActivity", Message: "no activity " + assignment.ActivityType, NonRetryable: true}}
	} else if value, err := call(fn, assignment.Payload); err != nil {
		result.Outcome = &pb.TaskResult_Failure{Failure: &pb.TaskFailure{ErrorType: errorType(err), Message: err.Error()}}
	} else {
		result.Outcome = &pb.TaskResult_Success{Success: value}
	}
	// Left `running` and sent under one lock: a heartbeat that no longer lists the attempt never
	// goes out before its result (the scheduler would take the attempt for one never received).
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, assignment.Task.TaskId)
	message := &pb.WorkerMessage{Message: &pb.WorkerMessage_Results{Results: &pb.Results{Results: []*pb.TaskResult{result}}}}
	if err := s.call.Send(message); err != nil {
		log.Printf("send failed: %v", err)
	}
}

// panicked is the error of an activity that panicked.
type panicked struct{ value interface{} }

func (p panicked) Error() string { return fmt.Sprintf("the activity panicked: %v", p.value) }

func errorType(err error) string {
	if _, ok := err.(panicked); ok {
		return "Panic"
	}
	return "Error"
}

// call runs an activity; a panic in it becomes that attempt's error (a panic that escaped a
// goroutine would end the whole process, every other running attempt with it).
func call(fn func([]byte) ([]byte, error), payload []byte) (value []byte, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			value, err = nil, panicked{recovered}
		}
	}()
	return fn(payload)
}

// heartbeats beats every `busy` while any attempt runs and every `idle` while none does (the
// welcome's idle_heartbeat_interval; zero: always `busy`), counted from the last heartbeat.
func (s *stream) heartbeats(busy, idle time.Duration, stop <-chan struct{}) {
	last := time.Now()
	for {
		s.mu.Lock()
		period := busy
		if len(s.running) == 0 && idle > busy {
			period = idle
		}
		s.mu.Unlock()
		timer := time.NewTimer(time.Until(last.Add(period)))
		select {
		case <-stop:
			timer.Stop()
			return
		case <-s.started:
			timer.Stop()
			continue // the period may be shorter now
		case <-timer.C:
		}
		// Every attempt it holds, and how many assignments it had read: the scheduler hands out
		// again what it sent and this worker never got.
		s.mu.Lock()
		refs := make([]*pb.TaskRef, 0, len(s.running))
		for _, ref := range s.running {
			refs = append(refs, ref)
		}
		heartbeat := &pb.Heartbeat{Running: refs, AssignmentsRead: proto.Uint64(s.read)}
		if err := s.call.Send(&pb.WorkerMessage{Message: &pb.WorkerMessage_Heartbeat{Heartbeat: heartbeat}}); err != nil {
			log.Printf("send failed: %v", err)
		}
		s.mu.Unlock()
		last = time.Now()
	}
}

func main() {
	target := env("LOWTIDE_TARGET", "127.0.0.1:50051")
	slots, err := strconv.Atoi(env("LOWTIDE_SLOTS", "4"))
	if err != nil || slots < 1 {
		log.Fatalf("LOWTIDE_SLOTS must be a positive whole number, not %q", os.Getenv("LOWTIDE_SLOTS"))
	}
	// Plaintext, as on loopback; grpc-go 1.33 (Debian 12) predates credentials/insecure.
	conn, err := grpc.Dial(target, grpc.WithInsecure())
	if err != nil {
		log.Fatalf("cannot dial %s: %v", target, err)
	}
	defer conn.Close()
	call, err := pb.NewWorkerServiceClient(conn).Connect(context.Background())
	if err != nil {
		log.Fatalf("cannot connect to %s: %v", target, err)
	}
	s := &stream{call: call, running: map[int64]*pb.TaskRef{}, started: make(chan struct{}, 1)}
	types := []*pb.ActivityType{}
	for name := range activities {
		types = append(types, &pb.ActivityType{Name: name})
	}
	s.send(&pb.WorkerMessage{Message: &pb.WorkerMessage_Hello{Hello: &pb.Hello{
		Pool: env("LOWTIDE_POOL", "default"), Queues: strings.Split(env("LOWTIDE_QUEUES", "default"), ","),
		ActivityTypes: types, Slots: uint32(slots)}}})

	var running sync.WaitGroup
	draining := make(chan struct{})
	var drainOnce sync.Once
	drain := func() {
		drainOnce.Do(func() {
			close(draining)
			// No new work (SlotUpdate 0: how a worker says it is leaving, so the scheduler
			// releases at once whatever is left when the stream ends, rather than wait for a
			// reconnect); once what runs has reported, end the stream.
			s.send(&pb.WorkerMessage{Message: &pb.WorkerMessage_SlotUpdate{SlotUpdate: &pb.SlotUpdate{Slots: 0}}})
			go func() {
				running.Wait()
				s.mu.Lock()
				defer s.mu.Unlock()
				_ = s.call.CloseSend()
			}()
		})
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-signals; drain() }()

	for {
		message, err := call.Recv()
		if err != nil {
			select {
			case <-draining:
				return // the scheduler ended the stream after our CloseSend
			default:
				log.Fatalf("stream to %s failed: %v", target, err)
			}
		}
		switch m := message.Message.(type) {
		case *pb.SchedulerMessage_Welcome:
			fmt.Printf("go worker %s connected to %s\n", m.Welcome.WorkerId, target)
			every := m.Welcome.HeartbeatInterval.AsDuration()
			if every <= 0 {
				every = 5 * time.Second
			}
			go s.heartbeats(every, m.Welcome.IdleHeartbeatInterval.AsDuration(), draining)
		case *pb.SchedulerMessage_Assignments:
			for _, assignment := range m.Assignments.Assignments {
				s.mu.Lock()
				s.running[assignment.Task.TaskId] = assignment.Task
				s.read++
				s.mu.Unlock()
				select {
				case s.started <- struct{}{}:
				default: // a wake-up is already pending
				}
				running.Add(1)
				go s.run(assignment, &running)
			}
		case *pb.SchedulerMessage_Drain:
			drain()
		}
	}
}
