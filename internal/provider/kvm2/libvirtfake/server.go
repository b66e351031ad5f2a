package libvirtfake

type serverState struct{}
