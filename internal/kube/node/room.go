package node

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/berth-sandbox/berth/errdefs"
)

// A paused sandbox gives the host its CPU and memory back (a memory pause
// writes its memory out, a filesystem pause ends its processes), so its
// pod gives the node's room back to the scheduler too. The scheduler
// counts a bound pod's requests until the pod ends, paused or not; so the
// node reports as allocatable its own allocatable plus the cpu and memory
// requests of its paused pods, and the scheduler's free room is what the
// running pods leave. Parked sandboxes then cost their node disk, not
// room for new ones.
//
// A resume takes the room back: the node resumes a pod's sandbox only if
// the requests of the pods that hold room (live, not terminal, running or
// being resumed) and its own fit the node's allocatable. Otherwise it
// refuses with resource_exhausted (ConditionPaused ResumeRefused), keeps
// the sandbox paused, and tries again each time a pod of the node changes
// (one that ends, is deleted or pauses frees room), until the pod is
// paused again or deleted. And a pod the scheduler bound into room a
// resume took back (it placed the pod before the node's allocatable
// shrank) is refused as a kubelet refuses a pod that does not fit: it
// fails with reason OutOfcpu or OutOfmemory.

// roomResources are the resources paused pods give back.
var roomResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// podRoom is the cpu and memory the scheduler counts of pod on its node
// (its effective requests: init containers, sidecars, pod-level resources
// and overhead as the scheduler takes them).
func podRoom(pod *corev1.Pod) corev1.ResourceList {
	all := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	out := corev1.ResourceList{}
	for _, r := range roomResources {
		if q, ok := all[r]; ok && !q.IsZero() {
			out[r] = q
		}
	}
	return out
}

// terminal reports whether ps's pod is over as the scheduler sees it: the
// phase last reported is Succeeded or Failed, or it is being deleted.
// Call with p.mu held.
func terminal(ps *podState) bool {
	return ps.deleted || ps.reason != "" || ps.phase == corev1.PodSucceeded || ps.phase == corev1.PodFailed
}

// givesRoom reports whether ps's pod is paused and gives its room back;
// call with p.mu held.
func givesRoom(ps *podState) bool {
	return ps.pz.paused && !ps.pz.resuming && !ps.deleted && ps.reason == ""
}

// pausedRoom is the room the node's paused pods give back.
func (p *Pods) pausedRoom() corev1.ResourceList {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := corev1.ResourceList{}
	for _, ps := range p.pods {
		if givesRoom(ps) && !terminal(ps) {
			addRoom(out, podRoom(ps.pod))
		}
	}
	return out
}

// noRoom says why want does not fit the node's allocatable beside the
// pods that hold room (all but skip), or "" when it fits; call with p.mu
// held. A node without an allocatable (tests) has room for anything.
func (p *Pods) noRoom(want corev1.ResourceList, skip *podState) (corev1.ResourceName, string) {
	if p.alloc == nil || len(want) == 0 {
		return "", ""
	}
	used := corev1.ResourceList{}
	for _, ps := range p.pods {
		if ps == skip || givesRoom(ps) || terminal(ps) {
			continue
		}
		addRoom(used, podRoom(ps.pod))
	}
	for _, r := range roomResources {
		w, ok := want[r]
		if !ok {
			continue
		}
		total := used[r].DeepCopy()
		total.Add(w)
		if alloc := p.alloc[r]; total.Cmp(alloc) > 0 {
			u, a := used[r], p.alloc[r]
			return r, fmt.Sprintf("%s: requested %s, used %s of %s allocatable", r, w.String(), u.String(), a.String())
		}
	}
	return "", ""
}

// admit refuses a new pod that does not fit the node's room as a kubelet
// does (reason OutOf<resource>); it reports whether the pod was admitted.
func (p *Pods) admit(ps *podState) bool {
	p.mu.Lock()
	res, why := p.noRoom(podRoom(ps.pod), ps)
	p.mu.Unlock()
	if res == "" {
		return true
	}
	p.fail(ps, "OutOf"+string(res), "Pod was rejected: node "+p.node+" did not have enough resource: "+why)
	return false
}

// admitResume takes room for ps's resume, or says why there is none (a
// resource_exhausted error); the caller holds ps.dmu.
func (p *Pods) admitResume(ps *podState) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, why := p.noRoom(podRoom(ps.pod), ps); why != "" {
		return fmt.Errorf("node %s has no room to resume the sandbox (%s); it resumes once room frees (a pod of the node ends or pauses), or pause it again: %w",
			p.node, why, errdefs.ErrResourceExhausted)
	}
	ps.pz.resuming = true
	return nil
}

// waitsForRoom reports whether ps's resume waits for room; call with p.mu
// held.
func waitsForRoom(ps *podState) bool { return ps.pz.noRoom && !ps.deleted && ps.reason == "" }

// roomWaiters lists the pods whose resume waits for room; call with p.mu
// held.
func (p *Pods) roomWaiters() []*podState {
	var out []*podState
	for _, ps := range p.pods {
		if waitsForRoom(ps) {
			out = append(out, ps)
		}
	}
	return out
}

// roomLoop tries the resumes that wait for room again each time a pod
// changed, one kick at a time (kicks while it works coalesce), until the
// node stops.
func (p *Pods) roomLoop() {
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.roomKick:
		}
		p.mu.Lock()
		waiters := p.roomWaiters()
		p.mu.Unlock()
		for _, ps := range waiters {
			p.applyPause(p.ctx, ps)
		}
	}
}

// roomChangedBy is called with ps's status as changed reported it: a
// change of whether ps gives its room back moves the node's allocatable
// (onRoom), and any change of a pod that does not itself wait may free
// room for those that do. Call without p.mu held.
func (p *Pods) roomChangedBy(ps *podState) {
	p.mu.Lock()
	gives := givesRoom(ps)
	moved := gives != ps.gaveRoom
	ps.gaveRoom = gives
	waiting := false
	for _, o := range p.pods {
		if !ps.pz.noRoom && waitsForRoom(o) {
			waiting = true
			break
		}
	}
	onRoom := p.onRoom
	p.mu.Unlock()
	if moved && onRoom != nil {
		onRoom()
	}
	if waiting && p.roomKick != nil {
		select {
		case p.roomKick <- struct{}{}:
		default:
		}
	}
}

func addRoom(to, add corev1.ResourceList) {
	for r, q := range add {
		cur := to[r]
		cur.Add(q)
		to[r] = cur
	}
}

// withRoom is alloc with room added to its cpu and memory.
func withRoom(alloc, room corev1.ResourceList) corev1.ResourceList {
	out := alloc.DeepCopy()
	for _, r := range roomResources {
		q, ok := room[r]
		if a, has := out[r]; ok && has {
			a.Add(q)
			out[r] = a
		}
	}
	return out
}

// sameRoom reports whether a and b hold the same cpu and memory.
func sameRoom(a, b corev1.ResourceList) bool {
	for _, r := range roomResources {
		x, y := a[r], b[r]
		if x.Cmp(y) != 0 {
			return false
		}
	}
	return true
}

// roomString is room as "cpu=…,memory=…", for logs.
func roomString(room corev1.ResourceList) string {
	var parts []string
	for _, r := range roomResources {
		if q, ok := room[r]; ok {
			parts = append(parts, string(r)+"="+q.String())
		}
	}
	return strings.Join(parts, ",")
}
