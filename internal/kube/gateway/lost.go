package gateway

// Annotations the gateway keeps on a sandbox pod for a lost node.
const (
	// AnnotationOnNodeLost is the sandbox's policy once its node is lost
	// (the create's on_node_lost, else the gateway's --on-node-lost):
	// fail or recreate.
	AnnotationOnNodeLost = "berth.dev/on-node-lost"
	// AnnotationRecreated counts the times the sandbox was made again
	// after its node was lost; AnnotationLostNode names the last node
	// it was lost on.
	AnnotationRecreated = "berth.dev/recreated"
	AnnotationLostNode  = "berth.dev/lost-node"
)
