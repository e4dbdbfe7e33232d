// A soak worker in Go, the twin of soak/worker.py and soak/worker.js: the same activities (plain,
// defer, flaky, doomed; fixed in the fixed pool), and the same record (a JSON line when an attempt
// begins, one when it ends) appended to SOAK_OUT. Built by clients/go/build.sh (`build.sh OUT
// soak/go_worker/main.go`), on the stubs it generates. It keeps no state across streams: when its
// stream fails it exits 1 and the soak starts it again, as a supervisor would (its attempts are
// then lost and retried by the scheduler). Configured by LOWTIDE_TARGET, WORKER_ID, SOAK_OUT,
// SOAK_POOL, SOAK_QUEUE and SOAK_SLOTS; SIGTERM stops it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"

	pb "lowtide/lowtidev1"
)

// protoCodec marshals with google.golang.org/protobuf (APIv2): see clients/go/worker/main.go.
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

var (
	id      = env("WORKER_ID", "worker-go")
	outMu   sync.Mutex
	outFile *os.File
)

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// record appends one JSON line to SOAK_OUT, written at once (a kill loses nothing written).
func record(fields map[string]interface{}) {
	fields["w"] = id
	fields["p"] = os.Getpid()
	line, _ := json.Marshal(fields)
	outMu.Lock()
	defer outMu.Unlock()
	if _, err := outFile.Write(append(line, '\n')); err != nil {
		log.Printf("record failed: %v", err)
	}
}

// perform runs one attempt of `name`; it returns the error type and message of a failure.
func perform(name string, assignment *pb.Assignment) (string, string) {
	headers := assignment.Headers
	nap, _ := strconv.Atoi(headers["soak-nap-ms"])
	time.Sleep(time.Duration(nap) * time.Millisecond)
	failUntil, _ := strconv.Atoi(headers["soak-fail-until"])
	attempt := int(assignment.Task.Attempt)
	if name == "flaky" && attempt < failUntil {
		return "Flaky", fmt.Sprintf("attempt %d fails", attempt)
	}
	if name == "doomed" {
		return "Doomed", "this task never succeeds"
	}
	return "", ""
}

type stream struct {
	mu      sync.Mutex
	call    pb.WorkerService_ConnectClient
	running map[int64]*pb.TaskRef
	read    uint64
	// Attempts the scheduler cancelled (no longer this worker's): run out, never reported.
	cancelled map[int64]uint32
}

func (s *stream) send(message *pb.WorkerMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call.Send(message); err != nil {
		log.Printf("send failed: %v", err)
	}
}

func (s *stream) run(assignment *pb.Assignment, names map[string]bool, done *sync.WaitGroup) {
	defer done.Done()
	task := assignment.Task
	record(map[string]interface{}{"t": task.TaskId, "a": task.Attempt, "s": now()})
	result := &pb.TaskResult{Task: task}
	errorType, message := "UnknownActivity", "no activity "+assignment.ActivityType
	if names[assignment.ActivityType] {
		errorType, message = perform(assignment.ActivityType, assignment)
	}
	if errorType == "" {
		result.Outcome = &pb.TaskResult_Success{Success: []byte("ok")}
	} else {
		result.Outcome = &pb.TaskResult_Failure{Failure: &pb.TaskFailure{ErrorType: errorType, Message: message}}
	}
	record(map[string]interface{}{"t": task.TaskId, "a": task.Attempt, "e": now(), "ok": errorType == ""})
	// Left `running` and sent under one lock: a heartbeat without it never goes out before its result.
	s.mu.Lock()
	defer s.mu.Unlock()
	if attempt, ok := s.cancelled[task.TaskId]; ok && attempt == task.Attempt {
		delete(s.cancelled, task.TaskId)
		return
	}
	delete(s.running, task.TaskId)
	results := &pb.WorkerMessage_Results{Results: &pb.Results{Results: []*pb.TaskResult{result}}}
	if err := s.call.Send(&pb.WorkerMessage{Message: results}); err != nil {
		log.Printf("send failed: %v", err)
	}
}

// heartbeats beats every `every`, listing what runs and how many assignments were read.
func (s *stream) heartbeats(every time.Duration, stop <-chan struct{}) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
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
	}
}

func main() {
	target := env("LOWTIDE_TARGET", "127.0.0.1:50051")
	pool := env("SOAK_POOL", "default")
	slots, err := strconv.Atoi(env("SOAK_SLOTS", "8"))
	if err != nil || slots < 1 {
		log.Fatalf("SOAK_SLOTS must be a positive whole number, not %q", os.Getenv("SOAK_SLOTS"))
	}
	outFile, err = os.OpenFile(os.Getenv("SOAK_OUT"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatalf("cannot open SOAK_OUT: %v", err)
	}
	names := map[string]bool{"plain": true, "defer": true, "flaky": true, "doomed": true}
	if pool == "fixed" {
		names = map[string]bool{"fixed": true}
	}
	conn, err := grpc.Dial(target, grpc.WithInsecure())
	if err != nil {
		log.Fatalf("cannot dial %s: %v", target, err)
	}
	defer conn.Close()
	call, err := pb.NewWorkerServiceClient(conn).Connect(context.Background())
	if err != nil {
		log.Fatalf("cannot connect to %s: %v", target, err)
	}
	s := &stream{call: call, running: map[int64]*pb.TaskRef{}, cancelled: map[int64]uint32{}}
	types := []*pb.ActivityType{}
	for name := range names {
		types = append(types, &pb.ActivityType{Name: name})
	}
	s.send(&pb.WorkerMessage{Message: &pb.WorkerMessage_Hello{Hello: &pb.Hello{
		WorkerId: id, Pool: pool, Queues: []string{env("SOAK_QUEUE", "default")},
		ActivityTypes: types, Slots: uint32(slots)}}})

	var running sync.WaitGroup
	draining := make(chan struct{})
	var drainOnce sync.Once
	drain := func() {
		drainOnce.Do(func() {
			close(draining)
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
				return
			default:
				log.Fatalf("stream to %s failed: %v", target, err)
			}
		}
		switch m := message.Message.(type) {
		case *pb.SchedulerMessage_Welcome:
			every := m.Welcome.HeartbeatInterval.AsDuration()
			if every <= 0 {
				every = 5 * time.Second
			}
			go s.heartbeats(every, draining)
		case *pb.SchedulerMessage_Assignments:
			for _, assignment := range m.Assignments.Assignments {
				s.mu.Lock()
				s.running[assignment.Task.TaskId] = assignment.Task
				s.read++
				s.mu.Unlock()
				running.Add(1)
				go s.run(assignment, names, &running)
			}
		case *pb.SchedulerMessage_Cancel:
			s.mu.Lock()
			for _, ref := range m.Cancel.Tasks {
				if held, ok := s.running[ref.TaskId]; ok && held.Attempt == ref.Attempt {
					delete(s.running, ref.TaskId)
					s.cancelled[ref.TaskId] = ref.Attempt
				}
			}
			s.mu.Unlock()
		case *pb.SchedulerMessage_Drain:
			// A drain is the scheduler's, not this worker's stop: what runs reports, and the
			// worker exits to be started again, on a fresh stream.
			drain()
		}
	}
}
